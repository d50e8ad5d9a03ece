//! Messages on stderr that cannot panic and cannot be obeyed. `eprintln!` panics when stderr is
//! a closed pipe (`virtgap record -o p.json 2>&1 >/dev/null | head -c 5`), which would end the run
//! before its profile is written; [`say!`](crate::say) writes the same text and drops a failed
//! write: a message nobody can read is no reason to stop. Every message goes through
//! [`printable`](virtgap_workloads::units::printable), since most carry names the user or another
//! host chose (a target, a directory, an output path): shown, never obeyed by the terminal.
//! [`progress!`](crate::progress) redraws one line in place; [`clear_progress`] erases it.
//! clippy.toml keeps `eprintln!` and `eprint!` out of non-test code.

use std::fmt;
use std::io::Write;

use virtgap_workloads::units::printable;

/// `eprintln!` that ignores a failed write and neutralises control characters.
#[macro_export]
macro_rules! say {
    () => {
        $crate::stderr::write_line(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::stderr::write_line(format_args!($($arg)*))
    };
}

/// Redraws the progress line (erasing what was there) with this text, control characters
/// neutralised; a failed write is dropped.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => {
        $crate::stderr::redraw(format_args!($($arg)*))
    };
}

/// Writes `args` and a newline to stderr under one lock; a failed write is dropped.
#[doc(hidden)]
pub fn write_line(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    let mut err = std::io::stderr().lock();
    let _ = err
        .write_all(printable(&text).as_bytes())
        .and_then(|()| err.write_all(b"\n"));
}

/// Erases the progress line and writes `args` in its place, without a newline.
#[doc(hidden)]
pub fn redraw(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    let mut err = std::io::stderr().lock();
    let _ = err
        .write_all(b"\r\x1b[2K")
        .and_then(|()| err.write_all(printable(&text).as_bytes()))
        .and_then(|()| err.flush());
}

/// Erases the progress line.
pub fn clear_progress() {
    let _ = std::io::stderr().lock().write_all(b"\r\x1b[2K");
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    /// Runs `f` with stderr (fd 2) on a pipe whose read end is closed, then puts stderr back.
    fn with_closed_stderr(f: impl FnOnce()) {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        // SAFETY: dup and dup2 on descriptors this test owns; fd 2 is restored from `saved`
        // before returning, and `saved` is closed after.
        unsafe {
            let saved = libc::dup(2);
            assert!(saved >= 0);
            assert_eq!(libc::dup2(writer.as_raw_fd(), 2), 2);
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            libc::dup2(saved, 2);
            libc::close(saved);
            outcome.unwrap();
        }
    }

    #[test]
    fn a_closed_stderr_is_not_a_panic() {
        with_closed_stderr(|| {
            crate::say!("lost {}", 1);
            crate::say!();
            crate::progress!("{}", "progress");
            super::clear_progress();
        });
    }

    /// What `f` writes to stderr (fd 2 on a pipe meanwhile).
    fn captured_stderr(f: impl FnOnce()) -> String {
        use std::io::Read;
        let (mut reader, writer) = std::io::pipe().unwrap();
        // SAFETY: dup and dup2 on descriptors this test owns; fd 2 is restored from `saved`.
        unsafe {
            let saved = libc::dup(2);
            assert!(saved >= 0);
            assert_eq!(libc::dup2(writer.as_raw_fd(), 2), 2);
            f();
            libc::dup2(saved, 2);
            libc::close(saved);
        }
        drop(writer);
        let mut text = String::new();
        reader.read_to_string(&mut text).unwrap();
        text
    }

    #[test]
    fn names_in_messages_are_shown_not_obeyed() {
        let name = "p\u{1b}]0;pwned\u{7}.json";
        let text = captured_stderr(|| {
            crate::say!("wrote profile {name}");
            crate::progress!("preparing {name}");
        });
        assert_eq!(
            text,
            "wrote profile p\\u{1b}]0;pwned\\u{7}.json\n\r\x1b[2Kpreparing p\\u{1b}]0;pwned\\u{7}.json"
        );
    }
}
