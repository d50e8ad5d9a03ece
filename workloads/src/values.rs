//! The values a workload file and the command line are written in — byte sizes, durations, key
//! distributions, read:write ratios — each parsed from the text a user writes and shown as it.
//! Both the workload spec (`spec`) and its kv table (`kv::spec`) are made of them.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// How random offsets are spread over the target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Distribution {
    Uniform,
    /// Zipf with exponent theta; hot blocks are scattered over the target by a hash.
    Zipf(f64),
}

impl FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "uniform" {
            return Ok(Self::Uniform);
        }
        if let Some(theta) = s.strip_prefix("zipf:") {
            let theta: f64 = theta
                .parse()
                .map_err(|_| format!("'{theta}' is not a number"))?;
            if !(theta > 0.0 && theta <= 10.0) {
                return Err(format!("zipf exponent {theta} must be in (0, 10]"));
            }
            return Ok(Self::Zipf(theta));
        }
        Err(format!(
            "'{s}' is not 'uniform' or 'zipf:THETA' (e.g. zipf:0.99)"
        ))
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Uniform => f.write_str("uniform"),
            Self::Zipf(t) => write!(f, "zipf:{t}"),
        }
    }
}

/// A byte count written as "4KiB", "1M", "1 GiB" or a plain integer; k/M/G are powers of 1024
/// as in fio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.starts_with('-') {
            return Err(format!("'{s}' is negative"));
        }
        // No size has more digits than u64::MAX; parse-size 1.1 overflows on some that do.
        if t.bytes().filter(u8::is_ascii_digit).count() > 20 {
            return Err(format!("'{s}' is larger than any size"));
        }
        parse_size::Config::new()
            .with_binary()
            .parse_size(t)
            .map(ByteSize)
            .map_err(|e| format!("'{s}' is not a size like 4KiB or 1GiB ({e})"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&crate::units::bytes_exact(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Int(n) if n < 0 => Err(serde::de::Error::custom(format!("{n} is negative"))),
            Raw::Int(n) => Ok(ByteSize(n as u64)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// A duration written as "10s", "1m 30s", "500ms".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span(pub Duration);

impl FromStr for Span {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        humantime::parse_duration(s.trim())
            .map(Span)
            .map_err(|e| format!("'{s}' is not a duration like 10s or 2m ({e})"))
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(self.0).to_string())
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// Serializes a value as the text it is written as (for fields whose type has no serde impl).
pub(crate) fn ser_display<T: fmt::Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// Deserializes a value from the text it is written as, with its own parse error.
pub(crate) fn de_from_str<'de, T: FromStr<Err = String>, D: Deserializer<'de>>(
    d: D,
) -> Result<T, D::Error> {
    String::deserialize(d)?
        .parse()
        .map_err(serde::de::Error::custom)
}

/// Client reads : client writes, e.g. 2:1 (ACT), 1:1, 19:1, 9:1, 1:0 (read-only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ratio {
    pub reads: u32,
    pub writes: u32,
}

impl FromStr for Ratio {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a reads:writes ratio like 2:1 or 1:0");
        let (r, w) = s.split_once(':').ok_or_else(bad)?;
        let reads: u32 = r.trim().parse().map_err(|_| bad())?;
        let writes: u32 = w.trim().parse().map_err(|_| bad())?;
        if reads == 0 && writes == 0 {
            return Err(format!("'{s}' has neither reads nor writes"));
        }
        Ok(Self { reads, writes })
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.reads, self.writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_as_binary_units() {
        assert_eq!("4k".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("4KiB".parse::<ByteSize>().unwrap(), ByteSize(4096));
        assert_eq!("1 GiB".parse::<ByteSize>().unwrap(), ByteSize(1 << 30));
        assert_eq!("1M".parse::<ByteSize>().unwrap(), ByteSize(1 << 20));
        assert!("-4k".parse::<ByteSize>().is_err());
        assert!("lots".parse::<ByteSize>().is_err());
    }

    #[test]
    fn distributions_parse() {
        assert_eq!(
            "uniform".parse::<Distribution>().unwrap(),
            Distribution::Uniform
        );
        assert_eq!(
            "zipf:0.99".parse::<Distribution>().unwrap(),
            Distribution::Zipf(0.99)
        );
        assert!("zipf:0".parse::<Distribution>().is_err());
        assert!("pareto".parse::<Distribution>().is_err());
    }
}
