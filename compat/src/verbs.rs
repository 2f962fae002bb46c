//! libibverbs: the device `iwarp0`, its context, PDs, memory regions,
//! completion queues and channels, queue pairs, and the function tables
//! verbs.h's inline functions call through.
//!
//! Every object handed to the application is a leaked `Box` of a
//! `#[repr(C)]` struct whose first field is the rdma-core struct
//! (`ibv_pd`, `ibv_cq`, ...), registered by address until
//! it is destroyed. The context is one `verbs_context` per process (its
//! `ibv_context` at its end, `abi_compat` marking it extended), opened
//! with the engine's [`Device`] the first time it is needed.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::mem::size_of;
use std::os::fd::AsRawFd;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::sync::{OnceLock, RwLock};

use iwarp_engine::iwarp;
use iwarp_engine::{Access, Cq, Device, Mr, Pd, WcOpcode, WcStatus, WorkCompletion, EMPTY_WC};

use crate::arena::Arena;
use crate::config::Config;
pub use crate::qp::{ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_qp_to_qp_ex, ibv_query_qp};
pub(crate) use crate::qp::{qp_by_num, recv_wrs, QpObj};
use crate::sys::*;
use crate::{is_live, obj, register, set_errno, unregister, Kind};

/// `__VERBS_ABI_IS_EXTENDED` of verbs.h: the context is embedded in a
/// `struct verbs_context`.
const VERBS_ABI_IS_EXTENDED: usize = usize::MAX;

/// The device's name, as `ibv_devices` lists it.
pub const DEVICE_NAME: &str = "iwarp0";

/// The process's engine device and configuration.
pub(crate) struct Global {
    pub(crate) dev: Device,
    pub(crate) cfg: Config,
}

/// The process's device once [`global`] opened it.
static GLOBAL: OnceLock<Result<Global, i32>> = OnceLock::new();

/// The engine device if it is open, without opening it.
pub(crate) fn opened() -> Option<&'static Global> {
    GLOBAL.get()?.as_ref().ok()
}

/// The engine device, opened on first use; the errno of the failure
/// otherwise (ENODEV).
pub(crate) fn global() -> Result<&'static Global, i32> {
    GLOBAL
        .get_or_init(|| {
            crate::logging::init();
            let cfg = Config::from_env().map_err(|e| {
                eprintln!("libiwarp_compat: {e}");
                libc::ENODEV
            })?;
            let dev = Device::open(cfg.backend.clone(), cfg.device).map_err(|e| {
                eprintln!("libiwarp_compat: opening the device failed: {e}");
                libc::ENODEV
            })?;
            Ok(Global { dev, cfg })
        })
        .as_ref()
        .map_err(|&e| e)
}

/// A raw pointer made `Send + Sync` for a process-wide static.
struct Raw<T>(*mut T);
// SAFETY: the pointees are leaked, never freed, and only read through
// shared references or by the application.
unsafe impl<T> Send for Raw<T> {}
// SAFETY: as for `Send`.
unsafe impl<T> Sync for Raw<T> {}

fn copy_str(dst: &mut [c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes()) {
        *d = b as c_char;
    }
}

/// The one device, leaked for the life of the process.
fn device() -> *mut ibv_device {
    static DEV: OnceLock<Raw<ibv_device>> = OnceLock::new();
    DEV.get_or_init(|| {
        let mut d = Box::<ibv_device>::default();
        d.node_type = IBV_NODE_RNIC;
        d.transport_type = IBV_TRANSPORT_IWARP;
        copy_str(&mut d.name, DEVICE_NAME);
        copy_str(&mut d.dev_name, "uverbs-iwarp0");
        copy_str(&mut d.dev_path, "/dev/null");
        copy_str(&mut d.ibdev_path, "/dev/null");
        Raw(Box::into_raw(d))
    })
    .0
}

/// The one context, leaked for the life of the process.
fn context() -> Result<*mut ibv_context, i32> {
    static CTX: OnceLock<Raw<verbs_context>> = OnceLock::new();
    global()?;
    let v = CTX.get_or_init(|| {
        let mut v = Box::<verbs_context>::default();
        v.sz = size_of::<verbs_context>();
        v.query_port = Some(query_port_ex);
        v.create_qp_ex = Some(crate::qp::create_qp_ex);
        let c = &mut v.context;
        c.device = device();
        c.ops.post_send = Some(crate::qp::post_send);
        c.ops.post_recv = Some(crate::qp::post_recv);
        c.ops.poll_cq = Some(poll_cq);
        c.ops.req_notify_cq = Some(req_notify_cq);
        c.ops.post_srq_recv = Some(crate::srq::post_srq_recv);
        c.cmd_fd = -1;
        // An epoll instance over the SRQs' event fds, readable while an
        // asynchronous event waits (crate::srq).
        // SAFETY: plain syscall.
        c.async_fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        c.num_comp_vectors = 1;
        c.abi_compat = VERBS_ABI_IS_EXTENDED as *mut c_void;
        Raw(Box::into_raw(v))
    });
    // SAFETY: `v.0` is the leaked, never freed `verbs_context`.
    Ok(unsafe { &raw mut (*v.0).context })
}

pub(crate) fn is_context(c: *const ibv_context) -> bool {
    !c.is_null() && context().is_ok_and(|p| p.cast_const() == c)
}

fn devices_enabled() -> bool {
    Config::from_env().is_ok()
}

// ---------------------------------------------------------------- devices

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    let n = usize::from(devices_enabled());
    if n == 0 {
        set_errno(libc::ENODEV);
    }
    // SAFETY: calloc of a NULL-terminated array; freed by
    // ibv_free_device_list.
    let list = unsafe { libc::calloc(2, size_of::<*mut ibv_device>()) }.cast::<*mut ibv_device>();
    if list.is_null() {
        set_errno(libc::ENOMEM);
        return null_mut();
    }
    if n == 1 {
        // SAFETY: `list` has two slots.
        unsafe { *list = device() };
    }
    if !num.is_null() {
        // SAFETY: the caller's out parameter.
        unsafe { *num = n as c_int };
    }
    list
}

#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: allocated with calloc by ibv_get_device_list.
    unsafe { libc::free(list.cast()) };
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev != device() {
        set_errno(libc::EINVAL);
        return std::ptr::null();
    }
    c"iwarp0".as_ptr()
}

/// The node GUID: 64 bits of `/etc/machine-id` (zero without one),
/// stable across runs on one machine.
fn node_guid() -> u64 {
    std::fs::read_to_string("/etc/machine-id")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim().get(..16)?, 16).ok())
        .unwrap_or(0)
}

/// The index of the device, as rdma-core numbers its devices: 0 for
/// `iwarp0`, -1 for anything else.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_index(dev: *mut ibv_device) -> c_int {
    if dev == device() {
        0
    } else {
        -1
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(dev: *mut ibv_device) -> __be64 {
    if dev != device() {
        set_errno(libc::EINVAL);
        return 0;
    }
    node_guid().to_be()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    if dev != device() {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    match context() {
        Ok(c) => c,
        Err(e) => {
            set_errno(e);
            null_mut()
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(ctx: *mut ibv_context) -> c_int {
    // The context and its engine live as long as the process.
    if is_context(ctx) {
        0
    } else {
        libc::EINVAL
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(
    ctx: *mut ibv_context,
    attr: *mut ibv_device_attr,
) -> c_int {
    if !is_context(ctx) || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's out parameter.
    let a = unsafe { &mut *attr };
    *a = device_attr();
    0
}

/// The device's limits, from the engine and the protocol core.
fn device_attr() -> ibv_device_attr {
    let max_objects = iwarp::slab::MAX_SLOTS.min(i32::MAX as u32) as c_int;
    let mut a = ibv_device_attr::default();
    copy_str(&mut a.fw_ver, env!("CARGO_PKG_VERSION"));
    a.node_guid = node_guid().to_be();
    a.sys_image_guid = a.node_guid;
    // A region's length is a usize; one message is at most 2^32 - 1.
    a.max_mr_size = u64::MAX;
    a.page_size_cap = 4096;
    a.max_qp = max_objects;
    // Queue depths are bounded by memory only.
    a.max_qp_wr = c_int::MAX;
    a.max_sge = iwarp::qp::MAX_SGE as c_int;
    // An RDMA Read takes exactly one local SGE.
    a.max_sge_rd = 1;
    a.max_cq = max_objects;
    a.max_cqe = c_int::MAX;
    a.max_mr = iwarp::mem::MAX_INDEX as c_int;
    a.max_pd = max_objects;
    let ird_ord = c_int::from(iwarp::wire::mpa::IrdOrd::MAX);
    a.max_qp_rd_atom = ird_ord;
    a.max_res_rd_atom = ird_ord;
    a.max_qp_init_rd_atom = ird_ord;
    a.atomic_cap = IBV_ATOMIC_HCA;
    a.max_srq = max_objects;
    a.max_srq_wr = c_int::MAX;
    a.max_srq_sge = iwarp::qp::MAX_SGE as c_int;
    a.max_pkeys = 1;
    a.phys_port_cnt = 1;
    a.device_cap_flags = IBV_DEVICE_MEM_MGT_EXTENSIONS;
    a
}

fn port_attr() -> ibv_port_attr {
    ibv_port_attr {
        state: IBV_PORT_ACTIVE,
        max_mtu: IBV_MTU_4096,
        active_mtu: IBV_MTU_1024,
        gid_tbl_len: 1,
        max_msg_sz: u32::MAX,
        pkey_tbl_len: 1,
        active_width: 1,
        active_speed: 1,
        phys_state: 5,
        link_layer: IBV_LINK_LAYER_ETHERNET as u8,
        ..Default::default()
    }
}

/// Copy the port's attributes into `len` bytes at `attr`.
///
/// # Safety
/// `attr` is valid for `len` bytes of writes.
unsafe fn write_port_attr(attr: *mut c_void, len: usize) {
    let p = port_attr();
    // SAFETY: the caller's buffer of `len` bytes; `p` is a plain struct
    // of at least as many bytes when `len` is capped by its size.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&raw const p).cast::<u8>(),
            attr.cast::<u8>(),
            len.min(size_of::<ibv_port_attr>()),
        )
    };
}

/// `ibv_query_port` of libibverbs 1.1, which the inline `ibv_query_port`
/// falls back to: its struct is `ibv_port_attr` without the fields from
/// `flags` on.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut c_void,
) -> c_int {
    if !is_context(ctx) || port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's compat struct.
    unsafe { write_port_attr(attr, std::mem::offset_of!(ibv_port_attr, flags)) };
    0
}

/// The extended context's `query_port`, which the inline
/// `ibv_query_port` of verbs.h calls.
unsafe extern "C" fn query_port_ex(
    ctx: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    len: usize,
) -> c_int {
    if !is_context(ctx) || port != 1 || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the caller's struct of `len` bytes.
    unsafe { write_port_attr(attr.cast(), len) };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    gid: *mut ibv_gid,
) -> c_int {
    if !is_context(ctx) || port != 1 || index != 0 || gid.is_null() {
        return -1;
    }
    // The kernel-socket backend has no link address of its own: the GID is
    // zero.
    // SAFETY: the caller's out parameter.
    unsafe { *gid = ibv_gid::default() };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    ctx: *mut ibv_context,
    port: u8,
    index: c_uint,
    ty: *mut ibv_gid_type,
) -> c_int {
    if !is_context(ctx) || port != 1 || index != 0 || ty.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's out parameter.
    unsafe { *ty = IBV_GID_TYPE_IB };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    ctx: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    if !is_context(ctx) || port != 1 || index != 0 || pkey.is_null() {
        return -1;
    }
    // SAFETY: the caller's out parameter.
    unsafe { *pkey = 0xffff };
    0
}

/// There is no sysfs directory behind the device.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

#[no_mangle]
pub unsafe extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// Registered memory is not pinned for a device: the engine reads and
/// writes it through the process's own mappings, so a `fork()` leaves
/// the parent's regions intact without `ibv_fork_init`.
#[no_mangle]
pub unsafe extern "C" fn ibv_is_fork_initialized() -> ibv_fork_status {
    IBV_FORK_UNNEEDED
}

// ---------------------------------------------------------------- PD, MR

/// A protection domain.
#[repr(C)]
pub(crate) struct PdObj {
    pub(crate) raw: ibv_pd,
    pub(crate) pd: Pd,
    /// Regions, QPs and SRQs in the PD: `ibv_dealloc_pd` fails with EBUSY
    /// while there are any, as rdma-core's does.
    pub(crate) users: AtomicU32,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(ctx: *mut ibv_context) -> *mut ibv_pd {
    if !is_context(ctx) {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let Ok(g) = global() else {
        set_errno(libc::ENODEV);
        return null_mut();
    };
    let o = Box::new(PdObj {
        raw: ibv_pd {
            context: ctx,
            handle: 0,
        },
        pd: g.dev.alloc_pd(),
        users: AtomicU32::new(0),
    });
    let p = Box::into_raw(o);
    register(p, Kind::Pd);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut ibv_pd) -> c_int {
    if obj::<_, PdObj>(pd, Kind::Pd).is_some_and(|p| p.users.load(Ordering::SeqCst) > 0) {
        return libc::EBUSY;
    }
    if !unregister(pd, Kind::Pd) {
        return libc::EINVAL;
    }
    // SAFETY: registered until now: a leaked Box<PdObj>, freed once.
    drop(unsafe { Box::from_raw(pd.cast::<PdObj>()) });
    0
}

/// A memory region over the application's memory.
#[repr(C)]
struct MrObj {
    raw: ibv_mr,
    _mr: Mr,
}

fn access_of(flags: c_int) -> Result<Access, i32> {
    let f = flags as u32;
    let known = IBV_ACCESS_LOCAL_WRITE
        | IBV_ACCESS_REMOTE_WRITE
        | IBV_ACCESS_REMOTE_READ
        | IBV_ACCESS_REMOTE_ATOMIC
        | IBV_ACCESS_RELAXED_ORDERING;
    if f & !known != 0 {
        return Err(libc::EINVAL);
    }
    // Remote write and atomic access need local write (ibv_reg_mr(3)).
    if f & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0
        && f & IBV_ACCESS_LOCAL_WRITE == 0
    {
        return Err(libc::EINVAL);
    }
    let mut a = Access::NONE;
    for (bit, acc) in [
        (IBV_ACCESS_LOCAL_WRITE, Access::LOCAL_WRITE),
        (IBV_ACCESS_REMOTE_WRITE, Access::REMOTE_WRITE),
        (IBV_ACCESS_REMOTE_READ, Access::REMOTE_READ),
        (IBV_ACCESS_REMOTE_ATOMIC, Access::REMOTE_ATOMIC),
    ] {
        if f & bit != 0 {
            a = a | acc;
        }
    }
    Ok(a)
}

/// Regions of a dma-buf (device memory another driver exports) need a
/// device that can reach it: none here. NULL with EOPNOTSUPP, as
/// libibverbs answers for a provider without them.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_dmabuf_mr(
    _pd: *mut ibv_pd,
    _offset: u64,
    _length: usize,
    _iova: u64,
    _fd: c_int,
    _access: c_int,
) -> *mut ibv_mr {
    set_errno(libc::EOPNOTSUPP);
    null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_uint,
) -> *mut ibv_mr {
    let Some(p) = obj::<_, PdObj>(pd, Kind::Pd) else {
        set_errno(libc::EINVAL);
        return null_mut();
    };
    let acc = match access_of(access as c_int) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return null_mut();
        }
    };
    if addr.is_null() && length != 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let Ok(g) = global() else {
        set_errno(libc::ENODEV);
        return null_mut();
    };
    // SAFETY: ibv_reg_mr(3)'s contract: the application keeps
    // `[addr, addr + length)` valid until ibv_dereg_mr, which drops the
    // `Mr` (deregistering it) before returning; it touches the bytes only
    // while no work request or peer access is outstanding on them, as
    // with RDMA hardware.
    let mr = unsafe { g.dev.reg_user_mr(&p.pd, addr.cast(), length, iova, acc) };
    let mr = match mr {
        Ok(m) => m,
        Err(e) => {
            set_errno(if e.kind() == std::io::ErrorKind::InvalidInput {
                libc::EINVAL
            } else {
                libc::ENOMEM
            });
            return null_mut();
        }
    };
    let o = Box::new(MrObj {
        raw: ibv_mr {
            context: p.raw.context,
            pd,
            addr,
            length,
            handle: 0,
            lkey: mr.lkey(),
            rkey: mr.rkey(),
        },
        _mr: mr,
    });
    p.users.fetch_add(1, Ordering::SeqCst);
    let r = Box::into_raw(o);
    register(r, Kind::Mr);
    r.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded with the same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, addr as u64, access as c_uint) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    // SAFETY: forwarded with the same contract.
    unsafe { ibv_reg_mr_iova2(pd, addr, length, iova, access as c_uint) }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut ibv_mr) -> c_int {
    if !unregister(mr, Kind::Mr) {
        return libc::EINVAL;
    }
    // SAFETY: registered until now: a leaked Box<MrObj>, freed once.
    let o = unsafe { Box::from_raw(mr.cast::<MrObj>()) };
    // The PD outlives its regions (dealloc_pd refuses while they live).
    if let Some(p) = obj::<_, PdObj>(o.raw.pd, Kind::Pd) {
        p.users.fetch_sub(1, Ordering::SeqCst);
    }
    drop(o);
    0
}

// ------------------------------------------------------ completion channels

/// A completion channel: its fd is an epoll instance over the event fds
/// of the CQs bound to it (each readable while it holds a notification).
#[repr(C)]
struct ChanObj {
    raw: ibv_comp_channel,
    cqs: AtomicI32,
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(ctx: *mut ibv_context) -> *mut ibv_comp_channel {
    if !is_context(ctx) {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    // SAFETY: plain syscall; errno is set on failure.
    let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if fd < 0 {
        return null_mut();
    }
    let p = Box::into_raw(Box::new(ChanObj {
        raw: ibv_comp_channel {
            context: ctx,
            fd,
            refcnt: 0,
        },
        cqs: AtomicI32::new(0),
    }));
    register(p, Kind::CompChannel);
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    let Some(c) = obj::<_, ChanObj>(ch, Kind::CompChannel) else {
        return libc::EINVAL;
    };
    if c.cqs.load(Ordering::SeqCst) > 0 {
        return libc::EBUSY;
    }
    unregister(ch, Kind::CompChannel);
    // SAFETY: registered until now: a leaked Box<ChanObj>, freed once; the
    // fd is ours.
    unsafe {
        let b = Box::from_raw(ch.cast::<ChanObj>());
        libc::close(b.raw.fd);
    }
    0
}

// ---------------------------------------------------------------- CQ

/// A completion queue. Bound to a completion channel, its engine eventfd
/// (one count per notification, [`Cq::req_notify`]) is in the channel's
/// epoll set with the CQ's address as the event's data.
#[repr(C)]
pub(crate) struct CqObj {
    raw: ibv_cq,
    pub(crate) cq: Cq,
    events: AtomicU32,
    /// The verbs QP number of each connected QP completing here, by the
    /// engine QP's number in the core (for `ibv_wc::qp_num`).
    qp_nums: RwLock<HashMap<u32, u32>>,
    /// QPs completing here: `ibv_destroy_cq` fails with EBUSY while there
    /// are any, as rdma-core's does.
    pub(crate) users: AtomicU32,
}

// SAFETY: `raw` holds the application's handles (channel, context,
// cq_context) as plain values the library never dereferences without
// checking them; the rest is Sync.
unsafe impl Sync for CqObj {}
// SAFETY: as for Sync.
unsafe impl Send for CqObj {}

/// Every CQ, for the data path's lock-free handle checks.
static CQS: Arena<CqObj> = Arena::new();

/// The live CQ at `cq` (data path: no process-wide lock).
pub(crate) fn cq_obj<'a>(cq: *const ibv_cq) -> Option<&'a CqObj> {
    CQS.get(cq.cast())
}

impl CqObj {
    /// Record (`Some`) or forget the verbs number of the engine QP
    /// `core_id` completing here.
    pub(crate) fn map_qp_num(&self, core_id: u32, qp_num: Option<u32>) {
        let mut m = self.qp_nums.write().unwrap_or_else(|e| e.into_inner());
        match qp_num {
            Some(n) => m.insert(core_id, n),
            None => m.remove(&core_id),
        };
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    ctx: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut ibv_comp_channel,
    comp_vector: c_int,
) -> *mut ibv_cq {
    if !is_context(ctx) || cqe < 1 || comp_vector != 0 {
        set_errno(libc::EINVAL);
        return null_mut();
    }
    let ch = if channel.is_null() {
        None
    } else {
        match obj::<_, ChanObj>(channel, Kind::CompChannel) {
            Some(c) => Some(c),
            None => {
                set_errno(libc::EINVAL);
                return null_mut();
            }
        }
    };
    let Ok(g) = global() else {
        set_errno(libc::ENODEV);
        return null_mut();
    };
    let o = CqObj {
        raw: ibv_cq {
            context: ctx,
            channel,
            cq_context,
            cqe,
            ..Default::default()
        },
        cq: g.dev.create_cq(cqe as usize),
        events: AtomicU32::new(0),
        qp_nums: RwLock::new(HashMap::new()),
        users: AtomicU32::new(0),
    };
    let fd = o.cq.event_fd().as_raw_fd();
    let p = CQS.insert(o);
    register(p, Kind::Cq);
    if let Some(c) = ch {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: p as u64,
        };
        // SAFETY: both fds are open; `ev` is a valid epoll_event.
        if unsafe { libc::epoll_ctl(c.raw.fd, libc::EPOLL_CTL_ADD, fd, &mut ev) } != 0 {
            unregister(p, Kind::Cq);
            drop(CQS.take(p));
            return null_mut();
        }
        c.cqs.fetch_add(1, Ordering::SeqCst);
    }
    p.cast()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut ibv_cq) -> c_int {
    if cq_obj(cq).is_some_and(|c| c.users.load(Ordering::SeqCst) > 0) {
        return libc::EBUSY;
    }
    if !unregister(cq, Kind::Cq) {
        return libc::EINVAL;
    }
    let Some(b) = CQS.take(cq.cast()) else {
        return libc::EINVAL;
    };
    if let Some(c) = obj::<_, ChanObj>(b.raw.channel, Kind::CompChannel) {
        let fd = b.cq.event_fd().as_raw_fd();
        // SAFETY: both fds are open.
        unsafe { libc::epoll_ctl(c.raw.fd, libc::EPOLL_CTL_DEL, fd, null_mut()) };
        c.cqs.fetch_sub(1, Ordering::SeqCst);
    }
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_resize_cq(cq: *mut ibv_cq, _cqe: c_int) -> c_int {
    if !is_live(cq, Kind::Cq) {
        return libc::EINVAL;
    }
    libc::EOPNOTSUPP
}

#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    let Some(c) = obj::<_, ChanObj>(ch, Kind::CompChannel) else {
        set_errno(libc::EINVAL);
        return -1;
    };
    if cq_out.is_null() || ctx_out.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    let nonblocking = crate::nonblocking(c.raw.fd);
    loop {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        let timeout = if nonblocking { 0 } else { -1 };
        // SAFETY: one epoll_event of room.
        let n = unsafe { libc::epoll_wait(c.raw.fd, &mut ev, 1, timeout) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return -1;
        }
        if n == 0 {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let p = ev.u64 as *mut ibv_cq;
        let Some(q) = obj::<_, CqObj>(p, Kind::Cq) else {
            continue;
        };
        if !q.cq.get_event() {
            // Another thread took this notification.
            continue;
        }
        q.events.fetch_add(1, Ordering::SeqCst);
        // SAFETY: the caller's out parameters.
        unsafe {
            *cq_out = p;
            *ctx_out = q.raw.cq_context;
        }
        return 0;
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut ibv_cq, n: c_uint) {
    if let Some(q) = obj::<_, CqObj>(cq, Kind::Cq) {
        let _ = q
            .events
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |e| {
                Some(e.saturating_sub(n))
            });
    }
}

/// `ops.req_notify_cq`, reached through the inline `ibv_req_notify_cq`.
unsafe extern "C" fn req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    let Some(q) = cq_obj(cq) else {
        return libc::EINVAL;
    };
    match q.cq.req_notify(solicited_only != 0) {
        Ok(()) => 0,
        Err(e) => e.raw_os_error().unwrap_or(libc::ENOMEM),
    }
}

fn wc_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocalLengthError => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocalProtectionError => IBV_WC_LOC_PROT_ERR,
        WcStatus::LocalQpOperationError => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::RemoteAccessError => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemoteOperationError => IBV_WC_REM_OP_ERR,
        WcStatus::RemoteInvalidRequestError => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::WrFlushError => IBV_WC_WR_FLUSH_ERR,
        WcStatus::GeneralError => IBV_WC_GENERAL_ERR,
    }
}

fn wc_opcode(o: WcOpcode) -> ibv_wc_opcode {
    match o {
        WcOpcode::Send | WcOpcode::ImmediateData => IBV_WC_SEND,
        WcOpcode::RdmaWrite => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::LocalInvalidate => IBV_WC_LOCAL_INV,
        WcOpcode::AtomicFetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::AtomicCompareSwap => IBV_WC_COMP_SWAP,
        WcOpcode::Recv => IBV_WC_RECV,
    }
}

/// A work completion as verbs gives it.
pub fn to_ibv_wc(w: &WorkCompletion, qp_num: u32) -> ibv_wc {
    let mut wc = ibv_wc {
        wr_id: w.wr_id,
        status: wc_status(w.status),
        opcode: wc_opcode(w.opcode),
        byte_len: w.byte_len,
        qp_num,
        ..Default::default()
    };
    if let Some(stag) = w.invalidated_stag {
        wc.wc_flags |= IBV_WC_WITH_INV;
        wc.__bindgen_anon_1.invalidated_rkey = stag;
    } else if let Some(imm) = w.imm_data {
        wc.wc_flags |= IBV_WC_WITH_IMM;
        // verbs carries 32 bits of immediate data, in network order.
        wc.__bindgen_anon_1.imm_data = (imm as u32).to_be();
    }
    wc
}

/// `ops.poll_cq`, reached through the inline `ibv_poll_cq`.
unsafe extern "C" fn poll_cq(cq: *mut ibv_cq, n: c_int, wc: *mut ibv_wc) -> c_int {
    let Some(q) = cq_obj(cq) else {
        return -libc::EINVAL;
    };
    if n < 0 || (n > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    let want = n as usize;
    if want == 0 {
        return 0;
    }
    // The empty poll, which applications repeat in a tight loop, costs
    // one queue look and a spin-loop hint: the engine's progress thread
    // may share the core (or its sibling) with the polling thread.
    let mut first = [EMPTY_WC; 1];
    if q.cq.poll(&mut first) == 0 {
        std::hint::spin_loop();
        return 0;
    }
    let nums = q.qp_nums.read().unwrap_or_else(|e| e.into_inner());
    let num = |w: &WorkCompletion| nums.get(&w.qp.raw()).copied().unwrap_or(0);
    // SAFETY: the caller's array holds `n` >= 1 entries.
    unsafe { wc.write(to_ibv_wc(&first[0], num(&first[0]))) };
    let mut done = 1usize;
    let mut buf = [EMPTY_WC; 16];
    while done < want {
        let room = (want - done).min(16);
        let k = q.cq.poll(&mut buf[..room]);
        if k == 0 {
            break;
        }
        for w in &buf[..k] {
            // SAFETY: the caller's array holds `n` entries; done < n.
            unsafe { wc.add(done).write(to_ibv_wc(w, num(w))) };
            done += 1;
        }
    }
    done as c_int
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut ibv_pd, _attr: *mut ibv_ah_attr) -> *mut ibv_ah {
    set_errno(if is_live(pd, Kind::Pd) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    });
    null_mut()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_attach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    if is_live(qp, Kind::Qp) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    }
}

#[no_mangle]
pub unsafe extern "C" fn ibv_detach_mcast(
    qp: *mut ibv_qp,
    _gid: *const ibv_gid,
    _lid: u16,
) -> c_int {
    if is_live(qp, Kind::Qp) {
        libc::EOPNOTSUPP
    } else {
        libc::EINVAL
    }
}

// ---------------------------------------------------------------- strings

// The texts are libibverbs', which applications print and sometimes
// compare.

#[no_mangle]
pub unsafe extern "C" fn ibv_wc_status_str(status: ibv_wc_status) -> *const c_char {
    let s: &'static std::ffi::CStr = match status {
        IBV_WC_SUCCESS => c"success",
        IBV_WC_LOC_LEN_ERR => c"local length error",
        IBV_WC_LOC_QP_OP_ERR => c"local QP operation error",
        IBV_WC_LOC_EEC_OP_ERR => c"local EE context operation error",
        IBV_WC_LOC_PROT_ERR => c"local protection error",
        IBV_WC_WR_FLUSH_ERR => c"Work Request Flushed Error",
        IBV_WC_MW_BIND_ERR => c"memory management operation error",
        IBV_WC_BAD_RESP_ERR => c"bad response error",
        IBV_WC_LOC_ACCESS_ERR => c"local access error",
        IBV_WC_REM_INV_REQ_ERR => c"remote invalid request error",
        IBV_WC_REM_ACCESS_ERR => c"remote access error",
        IBV_WC_REM_OP_ERR => c"remote operation error",
        IBV_WC_RETRY_EXC_ERR => c"transport retry counter exceeded",
        IBV_WC_RNR_RETRY_EXC_ERR => c"RNR retry counter exceeded",
        IBV_WC_LOC_RDD_VIOL_ERR => c"local RDD violation error",
        IBV_WC_REM_INV_RD_REQ_ERR => c"remote invalid RD request",
        IBV_WC_REM_ABORT_ERR => c"aborted error",
        IBV_WC_INV_EECN_ERR => c"invalid EE context number",
        IBV_WC_INV_EEC_STATE_ERR => c"invalid EE context state",
        IBV_WC_FATAL_ERR => c"fatal error",
        IBV_WC_RESP_TIMEOUT_ERR => c"response timeout error",
        IBV_WC_GENERAL_ERR => c"general error",
        IBV_WC_TM_ERR => c"TM error",
        IBV_WC_TM_RNDV_INCOMPLETE => c"TM software rendezvous",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_node_type_str(t: ibv_node_type) -> *const c_char {
    let s: &'static std::ffi::CStr = match t {
        IBV_NODE_CA => c"InfiniBand channel adapter",
        IBV_NODE_SWITCH => c"InfiniBand switch",
        IBV_NODE_ROUTER => c"InfiniBand router",
        IBV_NODE_RNIC => c"iWARP NIC",
        IBV_NODE_USNIC => c"usNIC",
        IBV_NODE_USNIC_UDP => c"usNIC UDP",
        IBV_NODE_UNSPECIFIED => c"unspecified",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_port_state_str(state: ibv_port_state) -> *const c_char {
    let s: &'static std::ffi::CStr = match state {
        IBV_PORT_NOP => c"no state change (NOP)",
        IBV_PORT_DOWN => c"down",
        IBV_PORT_INIT => c"init",
        IBV_PORT_ARMED => c"armed",
        IBV_PORT_ACTIVE => c"active",
        IBV_PORT_ACTIVE_DEFER => c"active defer",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn ibv_event_type_str(event: ibv_event_type) -> *const c_char {
    let s: &'static std::ffi::CStr = match event {
        IBV_EVENT_CQ_ERR => c"CQ error",
        IBV_EVENT_QP_FATAL => c"local work queue catastrophic error",
        IBV_EVENT_QP_REQ_ERR => c"invalid request local work queue error",
        IBV_EVENT_QP_ACCESS_ERR => c"local access violation work queue error",
        IBV_EVENT_COMM_EST => c"communication established",
        IBV_EVENT_SQ_DRAINED => c"send queue drained",
        IBV_EVENT_PATH_MIG => c"path migrated",
        IBV_EVENT_PATH_MIG_ERR => c"path migration request error",
        IBV_EVENT_DEVICE_FATAL => c"local catastrophic error",
        IBV_EVENT_PORT_ACTIVE => c"port active",
        IBV_EVENT_PORT_ERR => c"port error",
        IBV_EVENT_LID_CHANGE => c"LID change",
        IBV_EVENT_PKEY_CHANGE => c"P_Key change",
        IBV_EVENT_SM_CHANGE => c"SM change",
        IBV_EVENT_SRQ_ERR => c"SRQ catastrophic error",
        IBV_EVENT_SRQ_LIMIT_REACHED => c"SRQ limit reached",
        IBV_EVENT_QP_LAST_WQE_REACHED => c"last WQE reached",
        IBV_EVENT_CLIENT_REREGISTER => c"client reregistration",
        IBV_EVENT_GID_CHANGE => c"GID table change",
        IBV_EVENT_WQ_FATAL => c"WQ fatal",
        _ => c"unknown",
    };
    s.as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    ctx: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if !is_context(ctx)
        || port != 1
        || flags != 0
        || entry.is_null()
        || entry_size < size_of::<ibv_gid_entry>()
    {
        return libc::EINVAL;
    }
    if index != 0 {
        return libc::ENODATA;
    }
    // SAFETY: the caller's entry of at least `entry_size` bytes.
    unsafe {
        *entry = ibv_gid_entry {
            port_num: 1,
            gid_type: IBV_GID_TYPE_IB,
            ..Default::default()
        }
    };
    0
}

#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _port: u8,
) -> *mut ibv_ah {
    // SAFETY: forwarded; it only checks `pd`.
    unsafe { ibv_create_ah(pd, null_mut()) }
}

/// No address handle is ever created: every handle is bad.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    libc::EINVAL
}

/// Vendor (provider) entry points that binaries linked with mlx5 or efa
/// import; this device is neither.
mod vendor {
    use std::ffi::{c_int, c_void};
    use std::ptr::null_mut;

    use crate::set_errno;

    macro_rules! null_fns {
        ($($name:ident),*) => {$(
            #[no_mangle]
            pub unsafe extern "C" fn $name() -> *mut c_void {
                set_errno(libc::EOPNOTSUPP);
                null_mut()
            }
        )*};
    }
    macro_rules! errno_fns {
        ($($name:ident),*) => {$(
            #[no_mangle]
            pub unsafe extern "C" fn $name() -> c_int {
                libc::EOPNOTSUPP
            }
        )*};
    }
    null_fns!(
        efadv_create_qp_ex,
        mlx5dv_create_mkey,
        mlx5dv_create_qp,
        mlx5dv_dek_create,
        mlx5dv_open_device,
        mlx5dv_qp_ex_from_ibv_qp_ex
    );
    errno_fns!(
        efadv_query_device,
        mlx5dv_crypto_login,
        mlx5dv_dek_destroy,
        mlx5dv_destroy_mkey,
        mlx5dv_devx_general_cmd
    );
}
