//! What the lock commands print and how they exit. Pure; knows nothing of the network.

use keel_client::{AcquireResult, InspectResult, LockHolder, ReleaseResult, RenewResult};
use keel_types::validate::show_key;
use serde_json::{Value, json};

use super::{Output, Report, bytes, code, json_line, line};
use crate::duration;

/// An acquire: the token alone in text (so `TOKEN=$(keel lock acquire ...)` works), or the
/// whole answer in JSON. Not acquired: exit 1 and the holder on stderr (and the answer on
/// stdout in JSON).
pub fn acquire(name: &[u8], result: &AcquireResult, output: Output) -> Report {
    let stdout = match (&result.holder, output) {
        (Some(holder), Output::Text) if result.acquired => {
            line(holder.token.to_string().as_bytes())
        }
        (_, Output::Text) => Vec::new(),
        (holder, Output::Json) => json_line(&json!({
            "acquired": result.acquired,
            "name": bytes(name),
            "holder": holder.as_ref().map(holder_json),
            "available_in_ms": ms(result.available_in),
            "revision": result.revision,
        })),
    };
    if result.acquired {
        return Report::ok(stdout);
    }
    Report {
        stdout,
        stderr: busy_line(name, result),
        code: code::NOT_FOUND_OR_FAILED,
    }
}

pub fn renew(result: &RenewResult, output: Output) -> Report {
    let holder = &result.holder;
    Report::ok(match output {
        Output::Text => line(
            format!(
                "renewed (token {}, expires in {})",
                holder.token,
                duration::show_ms(ms(holder.ttl_remaining))
            )
            .as_bytes(),
        ),
        Output::Json => json_line(&json!({
            "renewed": true,
            "holder": holder_json(holder),
            "revision": result.revision,
        })),
    })
}

pub fn release(result: &ReleaseResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => {
            let mut text = format!("released (revision {})", result.revision);
            if let Some(successor) = &result.successor {
                text.push_str(&format!(
                    "; handed to {} with token {}",
                    show_key(&successor.owner),
                    successor.token
                ));
            }
            line(text.as_bytes())
        }
        Output::Json => json_line(&json!({
            "released": true,
            "successor": result.successor.as_ref().map(holder_json),
            "revision": result.revision,
        })),
    })
}

/// An inspect: one line saying who holds the lock, or that it is free (exit 0 either way).
pub fn inspect(name: &[u8], result: &InspectResult, output: Output) -> Report {
    let held = result
        .holder
        .as_ref()
        .filter(|holder| !holder.ttl_remaining.is_zero());
    Report::ok(match output {
        Output::Text => line(inspect_line(result, held).as_bytes()),
        Output::Json => json_line(&json!({
            "name": bytes(name),
            "held": held.is_some(),
            "holder": result.holder.as_ref().map(holder_json),
            "available_in_ms": ms(result.available_in),
            "revision": result.revision,
            "served_by": result.served_by,
        })),
    })
}

fn inspect_line(result: &InspectResult, held: Option<&LockHolder>) -> String {
    let available_in = duration::show_ms(ms(result.available_in));
    match (held, &result.holder) {
        (Some(holder), _) => format!(
            "held by {} with token {}, expires in {}",
            show_key(&holder.owner),
            holder.token,
            duration::show_ms(ms(holder.ttl_remaining))
        ),
        _ if result.available_in.is_zero() => "free".to_string(),
        (None, Some(expired)) => format!(
            "in its lock-delay for {available_in} (token {} expired)",
            expired.token
        ),
        (None, None) => format!("in its lock-delay for {available_in}"),
    }
}

fn busy_line(name: &[u8], result: &AcquireResult) -> String {
    let name = show_key(name);
    match result
        .holder
        .as_ref()
        .filter(|h| !h.ttl_remaining.is_zero())
    {
        Some(holder) => format!(
            "lock {name} is held by {} with token {} for {} more",
            show_key(&holder.owner),
            holder.token,
            duration::show_ms(ms(holder.ttl_remaining))
        ),
        None => format!(
            "lock {name} is in its lock-delay for {} more",
            duration::show_ms(ms(result.available_in))
        ),
    }
}

fn holder_json(holder: &LockHolder) -> Value {
    json!({
        "owner": bytes(&holder.owner),
        "token": holder.token,
        "ttl_remaining_ms": ms(holder.ttl_remaining),
        "expires_at_ms": holder.expires_at_ms,
        "lock_delay_ms": ms(holder.lock_delay),
    })
}

fn ms(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn holder(owner: &str, token: u64, ttl_ms: u64) -> LockHolder {
        LockHolder {
            owner: owner.as_bytes().to_vec(),
            token,
            ttl_remaining: Duration::from_millis(ttl_ms),
            expires_at_ms: 1_700_000_000_000,
            lock_delay: Duration::ZERO,
        }
    }

    fn acquired(holder: Option<LockHolder>, acquired: bool, available_ms: u64) -> AcquireResult {
        AcquireResult {
            acquired,
            holder,
            available_in: Duration::from_millis(available_ms),
            revision: 5,
            replayed: false,
        }
    }

    fn text(report: &Report) -> String {
        String::from_utf8(report.stdout.clone()).unwrap()
    }

    #[test]
    fn acquire_prints_the_token_alone_or_the_holder_and_exits_one_when_busy() {
        let mine = acquired(Some(holder("me", 5, 10_000)), true, 0);
        let theirs = acquired(Some(holder("w1", 3, 9_000)), false, 9_000);
        let delayed = acquired(None, false, 3_000);
        let cases = [
            (&mine, "5\n", "", 0),
            (
                &theirs,
                "",
                "lock \"jobs\" is held by \"w1\" with token 3 for 9s more",
                1,
            ),
            (
                &delayed,
                "",
                "lock \"jobs\" is in its lock-delay for 3s more",
                1,
            ),
        ];
        for (result, stdout, stderr, exit) in cases {
            let report = acquire(b"jobs", result, Output::Text);
            assert_eq!(text(&report), stdout);
            assert_eq!((report.stderr.as_str(), report.code), (stderr, exit));
        }
        let json: Value =
            serde_json::from_str(&text(&acquire(b"jobs", &mine, Output::Json))).unwrap();
        let expected = r#"{"acquired":true,"name":"jobs","available_in_ms":0,"revision":5,
            "holder":{"owner":"me","token":5,"ttl_remaining_ms":10000,
                      "expires_at_ms":1700000000000,"lock_delay_ms":0}}"#;
        assert_eq!(json, serde_json::from_str::<Value>(expected).unwrap());
        let report = acquire(b"jobs", &theirs, Output::Json);
        assert_eq!(report.code, 1);
        assert!(
            text(&report).contains("\"acquired\":false"),
            "{}",
            text(&report)
        );
    }

    #[test]
    fn renew_release_and_inspect_say_who_holds_what() {
        let renewed = RenewResult {
            holder: holder("me", 5, 10_000),
            revision: 8,
            replayed: false,
        };
        let handed = ReleaseResult {
            successor: Some(holder("w2", 9, 10_000)),
            revision: 9,
            replayed: false,
        };
        let freed = ReleaseResult {
            successor: None,
            ..handed.clone()
        };
        let inspected = |holder: Option<LockHolder>, available_ms| InspectResult {
            holder,
            available_in: Duration::from_millis(available_ms),
            revision: 9,
            served_by: 1,
        };
        let cases = [
            (
                renew(&renewed, Output::Text),
                "renewed (token 5, expires in 10s)\n",
            ),
            (release(&freed, Output::Text), "released (revision 9)\n"),
            (
                release(&handed, Output::Text),
                "released (revision 9); handed to \"w2\" with token 9\n",
            ),
            (
                inspect(
                    b"l",
                    &inspected(Some(holder("w1", 7, 9_000)), 9_000),
                    Output::Text,
                ),
                "held by \"w1\" with token 7, expires in 9s\n",
            ),
            (
                inspect(
                    b"l",
                    &inspected(Some(holder("w1", 7, 0)), 3_000),
                    Output::Text,
                ),
                "in its lock-delay for 3s (token 7 expired)\n",
            ),
            (
                inspect(b"l", &inspected(None, 3_000), Output::Text),
                "in its lock-delay for 3s\n",
            ),
            (inspect(b"l", &inspected(None, 0), Output::Text), "free\n"),
        ];
        for (report, expected) in cases {
            assert_eq!(text(&report), expected);
            assert_eq!(report.code, 0);
        }
        let json = text(&inspect(b"l", &inspected(None, 0), Output::Json));
        let json: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            (json["held"].clone(), json["holder"].clone()),
            (json!(false), Value::Null)
        );
    }
}
