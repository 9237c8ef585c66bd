//! The etcd backend quota: its bounds, its default, and sizes as operators write them
//! (`2GiB`, `512MiB`). Shared by `polisctl params bootstrap` (refuses bad input before
//! anything is written) and polis-node (refuses a parameters file that slipped past).
//!
//! Pure: no I/O.

/// etcd's own default, and Polis' when the cluster configuration says 0.
pub const DEFAULT_QUOTA_BYTES: u64 = 2 << 30;
/// The smallest quota accepted: room for a fresh cluster's records and a test that
/// fills it on purpose.
pub const MIN_QUOTA_BYTES: u64 = 2 << 20;
/// etcd warns above 8 GiB (its recommended maximum).
pub const MAX_QUOTA_BYTES: u64 = 8 << 30;

/// Why a size or a quota was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaError {
    #[error("{0:?} is not a size (write e.g. 2GiB, 512MiB, 64KiB or a number of bytes)")]
    NotASize(String),
    #[error("an etcd quota of {} is too small (at least {})", show(*.0), show(MIN_QUOTA_BYTES))]
    TooSmall(u64),
    #[error("an etcd quota of {} is too large (at most {})", show(*.0), show(MAX_QUOTA_BYTES))]
    TooLarge(u64),
}

/// Parses `N`, `NB`, `NKiB`, `NMiB`, `NGiB`, `NTiB` (case-insensitive units, spaces
/// allowed between number and unit).
pub fn parse_size(text: &str) -> Result<u64, QuotaError> {
    let bad = || QuotaError::NotASize(text.chars().take(40).collect());
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    if digits.is_empty() {
        return Err(bad());
    }
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "kib" | "k" => 10,
        "mib" | "m" => 20,
        "gib" | "g" => 30,
        "tib" | "t" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

/// The quota a member runs with: 0 is the default; others must lie within the bounds.
pub fn effective_quota(configured: u64) -> Result<u64, QuotaError> {
    match configured {
        0 => Ok(DEFAULT_QUOTA_BYTES),
        q if q < MIN_QUOTA_BYTES => Err(QuotaError::TooSmall(q)),
        q if q > MAX_QUOTA_BYTES => Err(QuotaError::TooLarge(q)),
        q => Ok(q),
    }
}

/// A size in the largest binary unit that divides it evenly enough to read (`2GiB`,
/// `3.5MiB`, `100B`).
pub fn show(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if bytes >= size {
            let whole = bytes / size;
            let tenth = (bytes % size) * 10 / size;
            return if tenth == 0 {
                format!("{whole}{name}")
            } else {
                format!("{whole}.{tenth}{name}")
            };
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("512 mib"), Ok(512 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("7B"), Ok(7));
        assert_eq!(parse_size("1TiB"), Ok(1 << 40));
        for bad in [
            "",
            "GiB",
            "2 GB",
            "-1MiB",
            "1.5GiB",
            "99999999999999999999",
            "20000000TiB",
        ] {
            assert!(parse_size(bad).is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn quotas_are_bounded() {
        assert_eq!(effective_quota(0), Ok(DEFAULT_QUOTA_BYTES));
        assert_eq!(effective_quota(4 << 20), Ok(4 << 20));
        assert_eq!(effective_quota(MIN_QUOTA_BYTES), Ok(MIN_QUOTA_BYTES));
        assert_eq!(effective_quota(MAX_QUOTA_BYTES), Ok(MAX_QUOTA_BYTES));
        assert_eq!(effective_quota(1 << 20), Err(QuotaError::TooSmall(1 << 20)));
        assert_eq!(effective_quota(9 << 30), Err(QuotaError::TooLarge(9 << 30)));
        assert_eq!(
            QuotaError::TooSmall(1 << 20).to_string(),
            "an etcd quota of 1MiB is too small (at least 2MiB)"
        );
    }

    #[test]
    fn sizes_show() {
        assert_eq!(show(2 << 30), "2GiB");
        assert_eq!(show(3 << 19), "1.5MiB");
        assert_eq!(show(100), "100B");
    }
}

/// Properties over arbitrary input (proptest).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_text_parses_or_is_refused(text in any::<String>()) {
            if let Err(e) = parse_size(&text) {
                prop_assert!(e.to_string().len() < 200);
            }
        }

        #[test]
        fn a_number_with_a_unit_is_that_many_bytes(
            n in any::<u64>(),
            (unit, shift) in prop_oneof![
                Just(("", 0u32)), Just(("B", 0)), Just(("k", 10)), Just((" KiB", 10)),
                Just(("MiB", 20)), Just(("gib", 30)), Just(("TiB", 40)),
            ],
        ) {
            prop_assert_eq!(
                parse_size(&format!("{n}{unit}")).ok(),
                n.checked_mul(1 << shift)
            );
        }

        #[test]
        // `show` rounds to a tenth of its unit (it is for people): only a whole number
        // of its unit comes back exactly.
        fn whole_sizes_show_as_sizes_that_parse_back(
            n in 1u64..1024,
            shift in prop_oneof![Just(0u32), Just(10), Just(20), Just(30), Just(40)],
        ) {
            let bytes = n << shift;
            let shown = show(bytes);
            prop_assert_eq!(parse_size(&shown), Ok(bytes), "{}", shown);
        }

        #[test]
        fn a_shown_size_is_within_a_tenth_of_its_unit(bytes in any::<u64>()) {
            let shown = show(bytes);
            let (number, unit) = shown.split_at(shown.find(|c: char| c.is_ascii_alphabetic()).unwrap());
            let scale = parse_size(&format!("1{unit}")).unwrap() as f64;
            let shown_bytes = number.parse::<f64>().unwrap() * scale;
            prop_assert!(shown_bytes <= bytes as f64 * (1.0 + 1e-12), "{}", shown);
            prop_assert!(bytes as f64 - shown_bytes < scale / 10.0 * (1.0 + 1e-9), "{}", shown);
        }

        #[test]
        fn effective_quotas_lie_within_the_bounds(q in any::<u64>()) {
            if let Ok(e) = effective_quota(q) {
                prop_assert!((MIN_QUOTA_BYTES..=MAX_QUOTA_BYTES).contains(&e));
            }
        }
    }
}
