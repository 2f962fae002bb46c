//! Runs Wireshark's `tshark` on a capture and summarises what its iWARP
//! dissectors (`iwarp_mpa`, `iwarp_ddp_rdmap`) decoded: the independent
//! wire-format oracle of the tests and of `iwarp-pcapcheck`.
//!
//! One tshark run produces both inputs:
//!
//! * `-T pdml -J "iwarp_mpa iwarp_ddp_rdmap _ws.malformed"`: the decoded
//!   tree of those protocols. Each FPDU is its own `iwarp_mpa` +
//!   `iwarp_ddp_rdmap` element, also when one TCP segment holds several
//!   FPDUs (the dissector uses TCP PDU reassembly). The CRC verdict exists
//!   only in the display text (`iwarp_mpa.crc_check` reads
//!   "0x… (Good CRC32)" or "0x… (Bad CRC32, should be 0x…)"), which plain
//!   `-T fields` output cannot show; PDML carries it as `showname`.
//! * `-z expert,warn`: the expert-info tap (errors and warnings) printed
//!   after the PDML. It also holds items the MPA dissector raises without
//!   a tree item (the "Rev field is NOT set to one" warnings on MPA rev 2
//!   request/reply frames), which never appear in PDML.
//!
//! The RPC-over-RDMA heuristic on top of DDP misreads ordinary Sends as
//! malformed RPC messages, so it is disabled (`--disable-heuristic
//! rpcrdma_iwarp`; if a tshark does not know that name the run is retried
//! without it).
//!
//! Wireshark decodes MPA rev 1 only, and checks CRCs only when it saw the
//! MPA Request and Reply of the stream with the C flag set.

use std::io;
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// What tshark decoded in a capture.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// DDP/RDMAP PDUs (`iwarp_ddp_rdmap` layers), i.e. dissected FPDUs;
    /// several per frame when a TCP segment carries several FPDUs.
    pub fpdus: usize,
    /// `iwarp_mpa` layers: MPA Request and Reply frames plus FPDUs.
    pub mpa_frames: usize,
    /// FPDUs whose CRC tshark verified as good.
    pub good_crc: usize,
    /// FPDUs whose CRC tshark found wrong.
    pub bad_crc: usize,
    /// FPDUs with an unchecked CRC field (CRC not negotiated).
    pub crc_absent: usize,
    /// Malformed-packet markers (dissector exceptions), any protocol.
    pub malformed: usize,
    /// Expert errors, one entry per occurrence, as "PROTOCOL: summary".
    pub expert_errors: Vec<String>,
    /// Expert warnings, one entry per occurrence, as "PROTOCOL: summary".
    pub expert_warnings: Vec<String>,
    /// RDMAP opcode of each FPDU in capture order, as Wireshark names
    /// them: "Write", "Read Request", "Read Response", "Send",
    /// "Send with Invalidate", "Send with SE", "Send with SE and
    /// Invalidate", "Terminate", …
    pub opcodes: Vec<String>,
}

/// The heuristic dissectors to disable, tried in order.
const DISABLE_HEURISTIC: &str = "rpcrdma_iwarp";

/// Whether a runnable `tshark` is on `PATH`.
pub fn available() -> bool {
    Command::new("tshark")
        .arg("-v")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Run tshark on `pcap` (pcap or pcapng) and summarise the iWARP
/// dissection. Fails when tshark cannot be run or rejects the file.
pub fn analyze(pcap: &Path) -> io::Result<Report> {
    analyze_with(pcap, true)
}

/// Like [`analyze`] with TCP reassembly off: each segment is dissected on
/// its own, so an FPDU counts only if one segment holds all of it and the
/// segment starts with an FPDU (or with FPDUs that do). When every FPDU of
/// a capture counts here too, its FPDUs are aligned with its segments
/// (RFC 5044 §8).
pub fn analyze_segments(pcap: &Path) -> io::Result<Report> {
    analyze_with(pcap, false)
}

/// How many frames of `pcap` match the display filter `filter`.
pub fn count(pcap: &Path, filter: &str) -> io::Result<usize> {
    fields(pcap, filter, &["frame.number"]).map(|rows| rows.len())
}

/// The values of `fields` (tshark field names) in every frame matching
/// `filter`, one row per frame; a field a frame lacks is an empty string.
pub fn fields(pcap: &Path, filter: &str, fields: &[&str]) -> io::Result<Vec<Vec<String>>> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r")
        .arg(pcap)
        .args(["-n", "-Y", filter, "-T", "fields", "-E", "separator=|"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.stdin(Stdio::null()).output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tshark -Y {filter} failed on {}: {}",
            pcap.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('|').map(str::to_string).collect())
        .collect())
}

fn analyze_with(pcap: &Path, reassemble: bool) -> io::Result<Report> {
    let mut out = run(pcap, true, reassemble)?;
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("disable") {
        // This tshark does not know the heuristic's name.
        out = run(pcap, false, reassemble)?;
    }
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "tshark failed on {} ({}): {}",
            pcap.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(parse(&String::from_utf8_lossy(&out.stdout)))
}

fn run(pcap: &Path, disable_heuristic: bool, reassemble: bool) -> io::Result<Output> {
    let mut cmd = Command::new("tshark");
    cmd.arg("-r").arg(pcap).arg("-n");
    if !reassemble {
        cmd.args(["-o", "tcp.desegment_tcp_streams:FALSE"]);
    }
    // A segment that starts with an MPA marker (`00 00 00 00`) would be
    // claimed by the ip.access dissector before MPA sees it.
    cmd.args(["--disable-protocol", "gsm_ipa"]);
    if disable_heuristic {
        cmd.args(["--disable-heuristic", DISABLE_HEURISTIC]);
    }
    cmd.args([
        "-T",
        "pdml",
        "-J",
        "iwarp_mpa iwarp_ddp_rdmap _ws.malformed",
    ])
    .args(["-z", "expert,warn"])
    .stdin(Stdio::null())
    .output()
}

/// Summarise tshark's stdout: PDML, then the expert tap.
fn parse(stdout: &str) -> Report {
    let (pdml, tap) = match stdout.find("</pdml>") {
        Some(end) => stdout.split_at(end),
        None => (stdout, ""),
    };
    let mut r = Report::default();
    for line in pdml.lines() {
        let line = line.trim_start();
        let is_proto = line.starts_with("<proto ");
        if !is_proto && !line.starts_with("<field ") {
            continue;
        }
        let Some(name) = attr(line, "name") else {
            continue;
        };
        let showname = attr(line, "showname").unwrap_or_default();
        match (is_proto, name.as_str()) {
            (true, "iwarp_ddp_rdmap") => r.fpdus += 1,
            (true, "iwarp_mpa") => r.mpa_frames += 1,
            // The visible marker; a hidden duplicate sits inside it.
            (true, "_ws.malformed") if attr(line, "hide").as_deref() != Some("yes") => {
                r.malformed += 1
            }
            (false, "iwarp_mpa.crc_check") => {
                if showname.contains("Good CRC") {
                    r.good_crc += 1;
                } else {
                    r.bad_crc += 1;
                }
            }
            (false, "iwarp_mpa.crc") => r.crc_absent += 1,
            (false, "iwarp_rdma.opcode") => r.opcodes.push(opcode_name(&showname, line)),
            _ => {}
        }
    }
    parse_expert(tap, &mut r);
    r
}

/// "…0011 = OpCode: Send (0x3)" → "Send"; the raw value if the text
/// has another shape.
fn opcode_name(showname: &str, line: &str) -> String {
    if let Some((_, rest)) = showname.split_once("OpCode: ") {
        let name = match rest.rfind(" (") {
            Some(i) => &rest[..i],
            None => rest,
        };
        return name.to_string();
    }
    attr(line, "show").unwrap_or_default()
}

/// Parse the `-z expert` tap: sections "Errors (N)", "Warns (N)", … each
/// with lines "frequency group protocol summary".
fn parse_expert(tap: &str, r: &mut Report) {
    #[derive(PartialEq)]
    enum Section {
        None,
        Errors,
        Warns,
        Other,
    }
    let mut section = Section::None;
    for line in tap.lines() {
        let t = line.trim();
        if t.starts_with("Errors (") {
            section = Section::Errors;
            continue;
        }
        if t.starts_with("Warns (") {
            section = Section::Warns;
            continue;
        }
        if ["Notes (", "Chats (", "Comments ("]
            .iter()
            .any(|h| t.starts_with(h))
        {
            section = Section::Other;
            continue;
        }
        let target = match section {
            Section::Errors => &mut r.expert_errors,
            Section::Warns => &mut r.expert_warnings,
            _ => continue,
        };
        let mut words = t.split_whitespace();
        let (Some(freq), Some(_group), Some(proto)) = (words.next(), words.next(), words.next())
        else {
            continue;
        };
        let Ok(freq) = freq.parse::<usize>() else {
            continue; // the "Frequency Group Protocol Summary" header
        };
        let summary = words.collect::<Vec<_>>().join(" ");
        for _ in 0..freq {
            target.push(format!("{proto}: {summary}"));
        }
    }
}

/// The unescaped value of attribute `key` in one PDML element line.
fn attr(line: &str, key: &str) -> Option<String> {
    let pat = format!(" {key}=\"");
    let start = line.find(&pat)? + pat.len();
    let len = line[start..].find('"')?;
    Some(unescape(&line[start..start + len]))
}

/// Undo XML escaping (`&quot;`, `&amp;`, `&lt;`, `&gt;`, `&apos;`, `&#N;`,
/// `&#xN;`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let Some(end) = rest.find(';') else {
            break;
        };
        let entity = &rest[1..end];
        let ch = match entity {
            "quot" => Some('"'),
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|h| u32::from_str_radix(h, 16))
                .or_else(|| entity.strip_prefix('#').map(str::parse))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match ch {
            Some(c) => {
                out.push(c);
                rest = &rest[end + 1..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pcap::{Side, TcpCapture};
    use std::path::PathBuf;

    const SAMPLE: &str = r#"<?xml version="1.0" encoding="utf-8"?>
<pdml version="0" creator="wireshark/4.0.17">
<packet>
  <proto name="iwarp_mpa" showname="iWARP Marker Protocol data unit Aligned framing" size="40" pos="66">
    <field name="iwarp_mpa.fpdu" showname="FPDU" size="40" pos="66" show="" value="">
      <field name="iwarp_mpa.ulpdulength" showname="ULPDU length: 34 bytes" size="2" pos="66" show="34" value="0022"/>
      <field name="iwarp_mpa.crc_check" showname="CRC check: 0x24f72441 (Good CRC32)" size="4" pos="102" show="0x24f72441" value="24f72441"/>
    </field>
  </proto>
  <proto name="iwarp_ddp_rdmap" showname="iWARP DDP and RDMAP" size="18" pos="68">
      <field name="iwarp_rdma.opcode" showname=".... 0011 = OpCode: Send (0x3)" size="1" pos="69" show="0x03" value="3" unmaskedvalue="43"/>
  </proto>
  <proto name="iwarp_mpa" showname="iWARP Marker Protocol data unit Aligned framing" size="40" pos="106">
      <field name="iwarp_mpa.crc_check" showname="CRC check: 0x00000000 (Bad CRC32, should be 0x12345678)" size="4" pos="142" show="0x00000000" value="00000000"/>
  </proto>
  <proto name="iwarp_ddp_rdmap" showname="iWARP DDP and RDMAP" size="18" pos="108">
      <field name="iwarp_rdma.opcode" showname=".... 0001 = OpCode: Read Request (0x1)" size="1" pos="109" show="0x01" value="1"/>
  </proto>
</packet>
<packet>
  <proto name="iwarp_mpa" showname="MPA" size="40" pos="66">
      <field name="iwarp_mpa.crc" showname="CRC: 0x00000000" size="4" pos="102" show="0x00000000" value="00000000"/>
  </proto>
  <proto name="iwarp_ddp_rdmap" showname="iWARP DDP and RDMAP" size="18" pos="68">
      <field name="iwarp_rdma.opcode" showname=".... 0000 = OpCode: Write (0x0)" size="1" pos="69" show="0x00" value="0"/>
  </proto>
  <proto name="_ws.malformed" showname="[Malformed Packet: RPCoRDMA]" size="0" pos="66">
    <field name="_ws.expert" showname="Expert Info (Error/Malformed): Malformed Packet (Exception occurred)" size="0" pos="0">
    </field>
    <proto name="_ws.malformed" showname="Malformed Packet" hide="yes" size="0" pos="66"/>
  </proto>
</packet>
</pdml>

Errors (1)
=============
   Frequency      Group           Protocol  Summary
           1  Malformed           RPCoRDMA  Malformed Packet (Exception occurred)

Warns (2)
=============
   Frequency      Group           Protocol  Summary
           2    Request          IWARP_MPA  Rev field is NOT set to one as required by RFC 5044

Notes (1)
=============
   Frequency      Group           Protocol  Summary
           1   Sequence                TCP  This frame initiates the connection closing
"#;

    #[test]
    fn parses_pdml_and_expert_tap() {
        let r = parse(SAMPLE);
        assert_eq!(r.fpdus, 3);
        assert_eq!(r.mpa_frames, 3);
        assert_eq!((r.good_crc, r.bad_crc, r.crc_absent), (1, 1, 1));
        assert_eq!(r.malformed, 1);
        assert_eq!(r.opcodes, ["Send", "Read Request", "Write"]);
        assert_eq!(
            r.expert_errors,
            ["RPCoRDMA: Malformed Packet (Exception occurred)"]
        );
        assert_eq!(r.expert_warnings.len(), 2);
        assert_eq!(
            r.expert_warnings[0],
            "IWARP_MPA: Rev field is NOT set to one as required by RFC 5044"
        );
    }

    #[test]
    fn unescapes_xml() {
        assert_eq!(
            unescape("a &amp; &quot;b&quot; &lt;&#62;&#x41;"),
            "a & \"b\" <>A"
        );
        assert_eq!(unescape("dangling & and &bogus;"), "dangling & and &bogus;");
        assert_eq!(
            attr(
                r#"<field name="x" showname="Q: &quot;y&quot;"/>"#,
                "showname"
            )
            .unwrap(),
            "Q: \"y\""
        );
        assert_eq!(
            attr(r#"<field showname="n" name="x"/>"#, "name").unwrap(),
            "x"
        );
    }

    /// The siw captures in the shared folder beside the repository (found
    /// by walking up from this crate), if present.
    fn captures_dir() -> Option<PathBuf> {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .ancestors()
            .map(|dir| dir.join("shared/peer/captures"))
            .find(|dir| dir.is_dir())
    }

    /// A real capture and tshark, or `None` (with a note) to skip.
    fn real_capture(name: &str) -> Option<PathBuf> {
        if !available() {
            eprintln!("note: tshark not on PATH, skipping");
            return None;
        }
        let path = captures_dir().map(|d| d.join(name)).filter(|p| p.is_file());
        if path.is_none() {
            eprintln!("note: shared/peer/captures/{name} not found, skipping");
        }
        path
    }

    #[test]
    fn siw_crc_capture_all_good() {
        let Some(path) = real_capture("siw-crc-rping-ib_write_bw.pcapng") else {
            return;
        };
        let r = analyze(&path).unwrap();
        assert_eq!(r.fpdus, 93);
        assert_eq!(r.good_crc, 93);
        assert_eq!((r.bad_crc, r.crc_absent, r.malformed), (0, 0, 0));
        assert!(r.expert_errors.is_empty(), "{:?}", r.expert_errors);
        assert_eq!(r.opcodes.len(), 93);
    }

    #[test]
    fn siw_no_crc_captures() {
        for (name, fpdus) in [("siw-rping.pcapng", 35), ("siw-ib_write_bw.pcapng", 132)] {
            let Some(path) = real_capture(name) else {
                return;
            };
            let r = analyze(&path).unwrap();
            assert_eq!(r.fpdus, fpdus, "{name}");
            assert_eq!(r.crc_absent, fpdus, "{name}");
            assert_eq!((r.good_crc, r.bad_crc, r.malformed), (0, 0, 0), "{name}");
            assert!(r.expert_errors.is_empty(), "{name}: {:?}", r.expert_errors);
        }
    }

    /// The TCP payload (hex) of the first frame that carries an FPDU.
    fn first_fpdu(path: &Path) -> Vec<u8> {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(path)
            .args(["-n", "--disable-heuristic", DISABLE_HEURISTIC])
            .args(["-Y", "iwarp_ddp_rdmap", "-T", "fields", "-e", "tcp.payload"])
            .output()
            .unwrap();
        assert!(out.status.success());
        let stdout = String::from_utf8(out.stdout).unwrap();
        let hex: String = stdout
            .lines()
            .next()
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .collect();
        (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// A fresh capture: MPA rev 1 Request/Reply with C=1, then `fpdus`
    /// from the client, all in one TCP segment.
    fn synthetic(name: &str, fpdus: &[u8]) -> PathBuf {
        const C_FLAG: u8 = 0x40;
        let mut req = b"MPA ID Req Frame".to_vec();
        req.extend_from_slice(&[C_FLAG, 1, 0, 0]);
        let mut rep = b"MPA ID Rep Frame".to_vec();
        rep.extend_from_slice(&[C_FLAG, 1, 0, 0]);
        let path = std::env::temp_dir().join(format!(
            "iwarp-tshark-test-{}-{name}.pcap",
            std::process::id()
        ));
        let file = std::fs::File::create(&path).unwrap();
        let mut cap = TcpCapture::new(file, 40001, 7174, 1460).unwrap();
        cap.send(Side::Client, &req).unwrap();
        cap.send(Side::Server, &rep).unwrap();
        cap.send(Side::Client, fpdus).unwrap();
        cap.finish().unwrap();
        path
    }

    #[test]
    fn bad_crc_is_reported() {
        let Some(real) = real_capture("siw-crc-rping-ib_write_bw.pcapng") else {
            return;
        };
        let fpdu = first_fpdu(&real);
        let ulpdu_len = usize::from(u16::from_be_bytes([fpdu[0], fpdu[1]]));
        assert_eq!(
            fpdu.len(),
            (2 + ulpdu_len).div_ceil(4) * 4 + 4,
            "one whole FPDU"
        );

        // Control: the untouched FPDU, alone and twice in one segment.
        let good = synthetic("good", &fpdu);
        let r = analyze(&good).unwrap();
        std::fs::remove_file(&good).unwrap();
        assert_eq!((r.fpdus, r.good_crc, r.bad_crc, r.malformed), (1, 1, 0, 0));
        assert_eq!(r.mpa_frames, 3);
        assert!(r.expert_errors.is_empty() && r.expert_warnings.is_empty());

        let twice = synthetic("twice", &[&fpdu[..], &fpdu[..]].concat());
        let r = analyze(&twice).unwrap();
        std::fs::remove_file(&twice).unwrap();
        assert_eq!((r.fpdus, r.good_crc, r.bad_crc), (2, 2, 0));
        assert_eq!(r.opcodes.len(), 2);

        // Flip the last ULPDU byte: the CRC no longer matches.
        let mut bad = fpdu.clone();
        bad[2 + ulpdu_len - 1] ^= 0x01;
        let path = synthetic("bad", &bad);
        let r = analyze(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!((r.fpdus, r.good_crc, r.bad_crc, r.malformed), (1, 0, 1, 0));
    }
}
