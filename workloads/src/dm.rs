//! A device-mapper device's table, read with the `DM_TABLE_STATUS` ioctl: what `dmsetup table`
//! prints, so the tail autopsy can follow a dm device's sectors to the disks below it (LVM
//! volumes are dm linear and striped targets).
//!
//! No crate is used: the `devicemapper` crate covers the whole DM ioctl interface and brings
//! its own dependency tree, where this needs one read-only call and its reply's layout
//! (linux/dm-ioctl.h).

use std::os::fd::AsRawFd;

/// One target of a table: sectors `[start, start + length)` of the dm device, its type
/// ("linear", "striped", …) and its parameters as the kernel prints them (devices as MAJ:MIN).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmTarget {
    pub start: u64,
    pub length: u64,
    pub kind: String,
    pub params: String,
}

/// `struct dm_ioctl` (linux/dm-ioctl.h), the header of every DM ioctl's buffer.
#[repr(C)]
#[derive(Clone, Copy)]
struct DmIoctl {
    version: [u32; 3],
    data_size: u32,
    data_start: u32,
    target_count: u32,
    open_count: i32,
    flags: u32,
    event_nr: u32,
    padding: u32,
    dev: u64,
    name: [u8; 128],
    uuid: [u8; 129],
    data: [u8; 7],
}

const _: () = assert!(std::mem::size_of::<DmIoctl>() == 312);

/// `struct dm_target_spec`'s size: sector_start, length, status, next, target_type[16].
const SPEC_BYTES: usize = 40;
/// DM_TABLE_STATUS = _IOWR(0xfd, 12, struct dm_ioctl).
const DM_TABLE_STATUS: libc::Ioctl = libc::_IOWR::<DmIoctl>(0xfd, 12);
/// Return the table, not the targets' status.
const DM_STATUS_TABLE_FLAG: u32 = 1 << 4;
/// Set by the kernel when the reply did not fit.
const DM_BUFFER_FULL_FLAG: u32 = 1 << 8;

/// The table of dm device `name` (its name under /dev/mapper, as /sys/block/dm-N/dm/name says).
pub fn table(name: &str) -> Result<Vec<DmTarget>, String> {
    if name.len() >= 128 {
        return Err(format!("dm device name {name:?} is too long"));
    }
    let control = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")
        .map_err(|e| format!("/dev/mapper/control: {e}"))?;
    let mut size = 16 << 10;
    loop {
        // u64 words: the header and the specs after it need 8-byte alignment.
        let mut buf = vec![0u64; size / 8];
        let mut header = DmIoctl {
            version: [4, 0, 0],
            data_size: size as u32,
            data_start: std::mem::size_of::<DmIoctl>() as u32,
            target_count: 0,
            open_count: 0,
            flags: DM_STATUS_TABLE_FLAG,
            event_nr: 0,
            padding: 0,
            dev: 0,
            name: [0; 128],
            uuid: [0; 129],
            data: [0; 7],
        };
        header.name[..name.len()].copy_from_slice(name.as_bytes());
        // SAFETY: buf holds at least size_of::<DmIoctl>() bytes, 8-byte aligned; the header is
        // a plain repr(C) value written into its start.
        unsafe { std::ptr::write(buf.as_mut_ptr().cast::<DmIoctl>(), header) };
        // SAFETY: control is an open descriptor; buf is `size` bytes the kernel reads the header
        // from and writes at most data_size (= size) bytes of reply into.
        let rc = unsafe { libc::ioctl(control.as_raw_fd(), DM_TABLE_STATUS, buf.as_mut_ptr()) };
        if rc != 0 {
            return Err(format!(
                "DM_TABLE_STATUS {name}: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: buf is initialized bytes of at least `size`; viewed as bytes for reading.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), size) };
        // SAFETY: the header sits at the start of the 8-byte aligned buffer.
        let reply = unsafe { std::ptr::read(buf.as_ptr().cast::<DmIoctl>()) };
        if reply.flags & DM_BUFFER_FULL_FLAG != 0 {
            if size >= 16 << 20 {
                return Err(format!("{name}: its table is over 16 MiB"));
            }
            size *= 4;
            continue;
        }
        return parse_reply(bytes, reply.data_start, reply.target_count);
    }
}

/// The targets in a DM_TABLE_STATUS reply: `count` specs from `data_start`, each followed by its
/// NUL-terminated parameters, the next one `next` bytes from the data's start.
fn parse_reply(bytes: &[u8], data_start: u32, count: u32) -> Result<Vec<DmTarget>, String> {
    let data = bytes
        .get(data_start as usize..)
        .ok_or("DM_TABLE_STATUS: the reply's data starts past its end")?;
    let mut targets = Vec::new();
    let mut at = 0usize;
    for _ in 0..count {
        let spec = data
            .get(at..at + SPEC_BYTES)
            .ok_or("DM_TABLE_STATUS: a target runs past the reply")?;
        let word = |i: usize| u64::from_ne_bytes(spec[i..i + 8].try_into().unwrap_or_default());
        let next = u32::from_ne_bytes(spec[20..24].try_into().unwrap_or_default()) as usize;
        let text = |b: &[u8]| {
            let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
            String::from_utf8_lossy(&b[..end]).into_owned()
        };
        let params = data
            .get(at + SPEC_BYTES..)
            .ok_or("DM_TABLE_STATUS: a target's parameters run past the reply")?;
        targets.push(DmTarget {
            start: word(0),
            length: word(8),
            kind: text(&spec[24..40]),
            params: text(params),
        });
        if next <= at && targets.len() < count as usize {
            return Err("DM_TABLE_STATUS: a target's next offset goes backwards".into());
        }
        at = next;
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply as dm-ioctl.c lays it out: header, then each spec and its parameters, the next
    /// spec 8-byte aligned, `next` counted from the data's start.
    fn reply(targets: &[(u64, u64, &str, &str)]) -> (Vec<u8>, u32) {
        let data_start = std::mem::size_of::<DmIoctl>();
        let mut data = Vec::new();
        for (start, length, kind, params) in targets {
            let spec_at = data.len();
            data.extend_from_slice(&start.to_ne_bytes());
            data.extend_from_slice(&length.to_ne_bytes());
            data.extend_from_slice(&0i32.to_ne_bytes());
            data.extend_from_slice(&0u32.to_ne_bytes()); // next, filled below
            let mut kind_bytes = [0u8; 16];
            kind_bytes[..kind.len()].copy_from_slice(kind.as_bytes());
            data.extend_from_slice(&kind_bytes);
            data.extend_from_slice(params.as_bytes());
            data.push(0);
            while data.len() % 8 != 0 {
                data.push(0);
            }
            let next = data.len() as u32;
            data[spec_at + 20..spec_at + 24].copy_from_slice(&next.to_ne_bytes());
        }
        let mut bytes = vec![0u8; data_start];
        bytes.extend_from_slice(&data);
        (bytes, data_start as u32)
    }

    #[test]
    fn a_table_reply_gives_each_target_and_its_parameters() {
        let (bytes, start) = reply(&[
            (0, 2048, "linear", "259:1 2048"),
            (2048, 8192, "striped", "2 128 259:2 0 259:3 0"),
        ]);
        let targets = parse_reply(&bytes, start, 2).unwrap();
        assert_eq!(
            targets,
            [
                DmTarget {
                    start: 0,
                    length: 2048,
                    kind: "linear".into(),
                    params: "259:1 2048".into()
                },
                DmTarget {
                    start: 2048,
                    length: 8192,
                    kind: "striped".into(),
                    params: "2 128 259:2 0 259:3 0".into()
                },
            ]
        );
        // A reply cut short is an error, not a guess.
        assert!(parse_reply(&bytes[..bytes.len() - 50], start, 2).is_err());
        assert!(parse_reply(&bytes, start, 3).is_err());
    }

    #[test]
    fn the_ioctl_number_matches_the_uapi_header() {
        // _IOWR(0xfd, 12, struct dm_ioctl): dir 3 << 30, size 312 << 16, type 0xfd << 8, nr 12.
        assert_eq!(DM_TABLE_STATUS as u32, 0xC138_FD0C);
    }
}
