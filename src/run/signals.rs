//! Stopping on signals. SIGINT, SIGTERM and SIGHUP (a closed terminal) stop the run, which then
//! writes what it has — a partial profile marked incomplete — and exits with 128 + the signal's
//! number, as a shell reports a death by that signal. A second signal while stopping exits at
//! once, saying that the partial profile and CSV files are dropped (temp files are already
//! unlinked, so nothing is left behind).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};

#[derive(Debug)]
pub struct StopSignals {
    /// Set by the first signal: the workload and the recorder wind down.
    pub stop: Arc<AtomicBool>,
    /// The last signal received (0: none).
    signal: Arc<AtomicUsize>,
}

impl StopSignals {
    /// Installs the handlers (SIGINT only when `with_sigint`: a TUI reads Ctrl-C as a key).
    pub fn install(with_sigint: bool) -> Result<Self> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let stop = Arc::new(AtomicBool::new(false));
        let signal = Arc::new(AtomicUsize::new(0));
        let signals: &[i32] = if with_sigint {
            &[SIGINT, SIGTERM, SIGHUP]
        } else {
            &[SIGTERM, SIGHUP]
        };
        for &sig in signals {
            let stopping = Arc::clone(&stop);
            // Registered first, so it sees the flag as the previous signal left it.
            // SAFETY: the action only loads an atomic, writes a static message to fd 2 and
            // calls _exit, all async-signal-safe.
            unsafe {
                signal_hook::low_level::register(sig, move || {
                    if stopping.load(Ordering::SeqCst) {
                        crate::run::output::remove_pending_tmp();
                        const MSG: &[u8] = b"virtgap: second signal: exiting now; whatever was not yet written (a partial profile, CSV) is not written\n";
                        libc::write(2, MSG.as_ptr().cast(), MSG.len());
                        libc::_exit(128 + sig);
                    }
                })
            }
            .context("installing signal handlers")?;
            signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)
                .context("installing signal handlers")?;
            signal_hook::flag::register(sig, Arc::clone(&stop))
                .context("installing signal handlers")?;
        }
        Ok(Self { stop, signal })
    }

    /// The signal that stopped the run, if one did.
    pub fn received(&self) -> Option<i32> {
        match self.signal.load(Ordering::SeqCst) {
            0 => None,
            n => Some(n as i32),
        }
    }

    /// 128 + the signal that stopped the run; 130 (SIGINT's) when stopped another way.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(128 + self.received().unwrap_or(signal_hook::consts::SIGINT) as u8)
    }
}
