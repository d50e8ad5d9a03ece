//! Fuzzing the readers of untrusted input (profiles, workload TOML) for a bounded time.
