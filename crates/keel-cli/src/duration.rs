//! Durations as the command line writes them (`500ms`, `30s`, `5m`, `2h`, `1d`): parsing for
//! `--ttl` and printing for remaining TTLs. Pure; knows nothing of clap or the network. Limits
//! (a TTL of 1 ms to 1 year) are checked by `keel_types::validate`, not here.

/// The units, longest suffix first so `ms` is not read as `m`.
const UNITS: [(&str, i64); 5] = [
    ("ms", 1),
    ("s", 1_000),
    ("m", 60_000),
    ("h", 3_600_000),
    ("d", 86_400_000),
];

const FORMS: &str = "500ms, 30s, 5m, 2h or 1d";

/// Milliseconds of `text`: an optional `-`, digits, and a unit. Signed, so that zero and
/// negative TTLs reach the limit check and get its message; saturates instead of overflowing
/// (the limit check then names the limit).
pub fn parse_ms(text: &str) -> Result<i64, String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let digits_end = unsigned
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(unsigned.len());
    let (digits, unit) = unsigned.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a duration; write a whole number and a unit: {FORMS}"
        ));
    }
    if unit.is_empty() {
        return Err(format!("{text:?} has no unit; write it as {FORMS}"));
    }
    let Some(&(_, unit_ms)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(format!(
            "{text:?} has unknown unit {unit:?}; use ms, s, m, h or d"
        ));
    };
    // Digits beyond i64 saturate, and so does the product.
    let count = digits.parse::<i64>().unwrap_or(i64::MAX);
    let ms = count.saturating_mul(unit_ms);
    Ok(if negative { -ms } else { ms })
}

/// `ms` the way `parse_ms` reads it, most significant units first, e.g. `1m30s`; below one
/// second, `250ms`. Parts of a second are dropped from longer durations.
pub fn show_ms(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let mut seconds = ms / 1_000;
    let mut text = String::new();
    for (name, unit_s) in [("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)] {
        let count = seconds / unit_s;
        if count > 0 {
            text.push_str(&format!("{count}{name}"));
            seconds %= unit_s;
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<i64, &str>) {
        match (parse_ms(text), expected) {
            (Ok(ms), Ok(want)) => assert_eq!(ms, want, "{text:?}"),
            (Err(message), Err(want)) => {
                assert!(message.contains(want), "{text:?}: {message}")
            }
            (got, want) => panic!("{text:?}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn durations_need_a_number_and_a_unit() {
        check("500ms", Ok(500));
        check("30s", Ok(30_000));
        check("5m", Ok(300_000));
        check("2h", Ok(7_200_000));
        check("1d", Ok(86_400_000));
        check("0s", Ok(0));
        check("-5s", Ok(-5_000));
        check("99999999999999999999d", Ok(i64::MAX));
        check("30", Err("has no unit; write it as 500ms, 30s"));
        check("-5", Err("has no unit"));
        check("s", Err("is not a duration"));
        check("", Err("is not a duration"));
        check("1.5s", Err("unknown unit \".5s\""));
        check("10 s", Err("unknown unit \" s\""));
        check("3w", Err("unknown unit \"w\""));
        check("5sm", Err("unknown unit \"sm\""));
    }

    #[test]
    fn durations_show_in_the_units_they_parse_in() {
        let cases = [
            (0, "0ms"),
            (250, "250ms"),
            (1_000, "1s"),
            (1_999, "1s"),
            (90_000, "1m30s"),
            (7_200_000, "2h"),
            (86_400_000 + 61_000, "1d1m1s"),
        ];
        for (ms, expected) in cases {
            assert_eq!(show_ms(ms), expected);
        }
    }
}
