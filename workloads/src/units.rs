//! Human-readable units for reports: binary byte sizes and latencies with their unit attached.

/// "4 KiB", "1.50 GiB", "512 B" — rounded for reading.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if value < 1024.0 {
            break;
        }
        value /= 1024.0;
        unit = u;
    }
    if value.fract() == 0.0 {
        format!("{value:.0} {unit}")
    } else {
        format!("{value:.2} {unit}")
    }
}

/// Exact form for specs: "4KiB", "1GiB", or plain bytes when not a whole unit.
pub fn bytes_exact(n: u64) -> String {
    const UNITS: [(&str, u32); 5] = [
        ("PiB", 50),
        ("TiB", 40),
        ("GiB", 30),
        ("MiB", 20),
        ("KiB", 10),
    ];
    for (unit, shift) in UNITS {
        if n != 0 && n.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// A latency with a unit chosen for its size: "850 ns", "12.3 µs", "4.56 ms", "1.20 s".
pub fn latency(ns: f64) -> String {
    // Below zero (a figure above an idle rate can be): the magnitude's unit, signed.
    if ns < 0.0 {
        let magnitude = latency(-ns);
        return if magnitude.bytes().any(|b| (b'1'..=b'9').contains(&b)) {
            format!("-{magnitude}")
        } else {
            magnitude
        };
    }
    if ns < 1_000.0 {
        format!("{ns:.0} ns")
    } else if ns < 1_000_000.0 {
        format!("{:.1} µs", ns / 1e3)
    } else if ns < 1_000_000_000.0 {
        format!("{:.2} ms", ns / 1e6)
    } else {
        format!("{:.2} s", ns / 1e9)
    }
}

/// A rate with an SI suffix: "74.2k", "1.20M", "950".
pub fn count(n: f64) -> String {
    if n >= 1e6 {
        format!("{:.2}M", n / 1e6)
    } else if n >= 1e4 {
        format!("{:.1}k", n / 1e3)
    } else if n > 0.0 && n < 10.0 {
        format!("{n:.1}")
    } else {
        format!("{n:.0}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_bytes() {
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(1536 * 1024 * 1024), "1.50 GiB");
        assert_eq!(bytes_exact(4096), "4KiB");
        assert_eq!(bytes_exact(1 << 30), "1GiB");
        assert_eq!(bytes_exact(1000), "1000");
    }

    #[test]
    fn formats_latencies_and_counts() {
        assert_eq!(latency(850.0), "850 ns");
        assert_eq!(latency(12_345.0), "12.3 µs");
        assert_eq!(latency(4_560_000.0), "4.56 ms");
        assert_eq!(latency(-334_893.0), "-334.9 µs");
        assert_eq!(latency(-0.2), "0 ns");
        assert_eq!(count(74_210.0), "74.2k");
        assert_eq!(count(950.0), "950");
    }
}

/// `text` made safe to print on a terminal: control characters other than newline and tab
/// (escape sequences above all) become visible `\u{…}` escapes, so a workload or profile from
/// elsewhere cannot move the cursor, recolour or retitle the user's terminal.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text
        .chars()
        .any(|c| c.is_control() && c != '\n' && c != '\t')
    {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| {
            if c.is_control() && c != '\n' && c != '\t' {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// `x` with `decimals` places, never "-0.0": a value that rounds to zero is shown unsigned (an
/// empty float sum is -0.0, and a tiny negative rounds to "-0.0" where nothing was negative
/// worth saying).
pub fn fixed(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    match s.strip_prefix('-') {
        Some(rest) if rest.bytes().all(|b| b == b'0' || b == b'.') => rest.to_string(),
        _ => s,
    }
}

/// `text` kept on one line, for a field another process, host or user chose (a command line,
/// a label, a CPU model) placed inside a report of many lines: every control character —
/// newlines and tabs too, which [`printable`] keeps — is shown as its escape (`\n`), so the
/// field cannot begin a line of its own and pass for one of the report's.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

#[cfg(test)]
mod printable_tests {
    #[test]
    fn escape_sequences_are_shown_not_obeyed() {
        assert_eq!(super::printable("plain\tname\n"), "plain\tname\n");
        assert_eq!(
            super::printable("a\u{1b}]0;pwned\u{7}b"),
            "a\\u{1b}]0;pwned\\u{7}b"
        );
    }

    #[test]
    fn nothing_rounds_to_a_negative_zero() {
        assert_eq!(super::fixed(-0.0, 1), "0.0");
        assert_eq!(super::fixed(-0.0004, 3), "0.000");
        assert_eq!(super::fixed(-0.04, 1), "0.0");
        assert_eq!(super::fixed(-0.06, 1), "-0.1");
        assert_eq!(super::fixed(12.345, 0), "12");
    }

    #[test]
    fn one_line_fields_cannot_start_a_line() {
        assert_eq!(super::one_line("plain name"), "plain name");
        assert_eq!(
            super::one_line("x\n  block requests: 999 FORGED\r\t\u{1b}"),
            "x\\n  block requests: 999 FORGED\\r\\t\\u{1b}"
        );
    }
}
