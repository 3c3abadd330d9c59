//! Randomness for backoff jitter and the client's default owner name, from `rand`'s
//! thread-local generator (seeded from the OS). Not for anything secret.

/// A random number in 0..1.
pub(crate) fn unit() -> f64 {
    rand::random()
}

/// The owner a client acquires locks and begins idempotency records as, unless a call names
/// another: `host/pid/random hex`, unique per `Client` (two clients of one process differ).
pub(crate) fn owner() -> Vec<u8> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_string())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "host".to_string());
    // At most 128 ASCII bytes, so the owner stays within `OWNER_BYTES_MAX` whatever the host.
    let host: String = host
        .chars()
        .filter(|c| c.is_ascii_graphic() && *c != '/')
        .take(128)
        .collect();
    format!(
        "{host}/{}/{:016x}",
        std::process::id(),
        rand::random::<u64>()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_are_unique_valid_and_name_the_process() {
        let (first, second) = (owner(), owner());
        assert_ne!(first, second);
        for owner in [&first, &second] {
            assert_eq!(keel_types::validate::check_owner(owner), Ok(()));
            let text = String::from_utf8(owner.clone()).unwrap();
            let pid = format!("/{}/", std::process::id());
            assert!(text.contains(&pid), "{text}");
        }
    }

    #[test]
    fn unit_is_within_zero_and_one() {
        for _ in 0..100 {
            assert!((0.0..1.0).contains(&unit()));
        }
    }
}
