//! The I/O side of the stack: AF_XDP sockets, the poll-mode engine on pinned cores, and the kernel-socket backend that runs the same protocol core over ordinary TCP sockets.
