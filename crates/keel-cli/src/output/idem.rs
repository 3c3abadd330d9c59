//! What the idempotency commands print and how they exit. Pure; knows nothing of the
//! network. Text answers start with the record's state, one word, then the token, owner or
//! result (raw bytes), so scripts can branch on the first word.

use std::time::Duration;

use keel_client::{AbortResult, BeginResult, CompleteResult, IdempotencyGetResult, RecordState};
use keel_types::validate::show_key;
use serde_json::{Value, json};

use super::{Output, Report, ValueForm, bytes, code, json_line};

/// A begin: `started TOKEN`, `in-progress OWNER` or `completed RESULT` (exit 0 for all).
pub fn begin(result: &BeginResult, output: Output) -> Report {
    Report::ok(match (result, output) {
        (BeginResult::Started { token, .. }, Output::Text) => {
            words("started", token.to_string().as_bytes())
        }
        (BeginResult::InProgress { owner, .. }, Output::Text) => words("in-progress", owner),
        (BeginResult::Completed { result, .. }, Output::Text) => words("completed", result),
        (
            BeginResult::Started {
                token,
                ttl_remaining,
            },
            Output::Json,
        ) => json_line(&json!({
            "state": "started",
            "token": token,
            "ttl_remaining_ms": ms(*ttl_remaining),
        })),
        (
            BeginResult::InProgress {
                owner,
                ttl_remaining,
            },
            Output::Json,
        ) => json_line(&in_progress_json(owner, *ttl_remaining)),
        (
            BeginResult::Completed {
                result,
                ttl_remaining,
            },
            Output::Json,
        ) => json_line(&completed_json(result, *ttl_remaining)),
    })
}

pub fn complete(result: &CompleteResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => words(
            "completed",
            format!("(revision {})", result.revision).as_bytes(),
        ),
        Output::Json => {
            let mut value = completed_json(&result.result, result.ttl_remaining);
            value["revision"] = json!(result.revision);
            json_line(&value)
        }
    })
}

pub fn abort(result: &AbortResult, output: Output) -> Report {
    Report::ok(match output {
        Output::Text => words(
            "aborted",
            format!("(revision {})", result.revision).as_bytes(),
        ),
        Output::Json => json_line(&json!({ "aborted": true, "revision": result.revision })),
    })
}

/// A read: `in-progress OWNER` or `completed RESULT`; no live record: exit 1. In the exact
/// form, the result's bytes alone; a record in progress then has nothing to show: its owner
/// goes to stderr, exit 1.
pub fn get(
    scope: &[u8],
    id: &[u8],
    result: &IdempotencyGetResult,
    output: Output,
    form: ValueForm,
) -> Report {
    if (output, form) == (Output::Text, ValueForm::Exact) {
        return get_exact(scope, id, result);
    }
    let stdout = match (&result.state, output) {
        (Some(RecordState::InProgress { owner, .. }), Output::Text) => words("in-progress", owner),
        (Some(RecordState::Completed { result, .. }), Output::Text) => words("completed", result),
        (None, Output::Text) => Vec::new(),
        (state, Output::Json) => {
            let mut value = match state {
                Some(RecordState::InProgress {
                    owner,
                    ttl_remaining,
                }) => in_progress_json(owner, *ttl_remaining),
                Some(RecordState::Completed {
                    result,
                    ttl_remaining,
                }) => completed_json(result, *ttl_remaining),
                None => json!({ "state": "none" }),
            };
            value["revision"] = json!(result.revision);
            value["served_by"] = json!(result.served_by);
            json_line(&value)
        }
    };
    let mut report = Report::ok(stdout);
    if result.state.is_none() {
        report.stderr = missing(scope, id);
        report.code = code::NOT_FOUND_OR_FAILED;
    }
    report
}

/// `idem get --raw`: the result's bytes exactly, or exit 1 with nothing on stdout.
fn get_exact(scope: &[u8], id: &[u8], result: &IdempotencyGetResult) -> Report {
    let stderr = match &result.state {
        Some(RecordState::Completed { result, .. }) => return Report::ok(result.clone()),
        Some(RecordState::InProgress { owner, .. }) => format!(
            "idempotency record {} in scope {} is in progress (owner {}); it has no result yet",
            show_key(id),
            show_key(scope),
            show_key(owner)
        ),
        None => missing(scope, id),
    };
    Report {
        stdout: Vec::new(),
        stderr,
        code: code::NOT_FOUND_OR_FAILED,
    }
}

fn missing(scope: &[u8], id: &[u8]) -> String {
    format!(
        "no idempotency record {} in scope {}",
        show_key(id),
        show_key(scope)
    )
}

fn in_progress_json(owner: &[u8], ttl_remaining: Duration) -> Value {
    json!({
        "state": "in-progress",
        "owner": bytes(owner),
        "ttl_remaining_ms": ms(ttl_remaining),
    })
}

fn completed_json(result: &[u8], ttl_remaining: Duration) -> Value {
    json!({
        "state": "completed",
        "result": bytes(result),
        "ttl_remaining_ms": ms(ttl_remaining),
    })
}

/// `word`, a space, `rest` (raw bytes) and a newline.
fn words(word: &str, rest: &[u8]) -> Vec<u8> {
    let mut out = format!("{word} ").into_bytes();
    out.extend_from_slice(rest);
    out.push(b'\n');
    out
}

fn ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(report: &Report) -> String {
        String::from_utf8(report.stdout.clone()).unwrap()
    }

    fn parsed(report: &Report) -> Value {
        serde_json::from_slice(&report.stdout).unwrap()
    }

    #[test]
    fn begin_starts_with_the_state() {
        let second = Duration::from_secs(1);
        let started = BeginResult::Started {
            token: 9,
            ttl_remaining: 30 * second,
        };
        let busy = BeginResult::InProgress {
            owner: b"w1".to_vec(),
            ttl_remaining: second,
        };
        let done = BeginResult::Completed {
            result: b"charge ch_123".to_vec(),
            ttl_remaining: second,
        };
        let cases = [
            (
                &started,
                "started 9\n",
                r#"{"state":"started","token":9,"ttl_remaining_ms":30000}"#,
            ),
            (
                &busy,
                "in-progress w1\n",
                r#"{"state":"in-progress","owner":"w1","ttl_remaining_ms":1000}"#,
            ),
            (
                &done,
                "completed charge ch_123\n",
                r#"{"state":"completed","result":"charge ch_123","ttl_remaining_ms":1000}"#,
            ),
        ];
        for (result, line, json) in cases {
            assert_eq!(text(&begin(result, Output::Text)), line);
            let expected: Value = serde_json::from_str(json).unwrap();
            assert_eq!(parsed(&begin(result, Output::Json)), expected);
        }
    }

    #[test]
    fn writes_print_their_revision_and_a_missing_record_exits_one() {
        let completed = CompleteResult {
            result: b"r".to_vec(),
            ttl_remaining: Duration::from_secs(60),
            revision: 12,
            replayed: false,
        };
        let aborted = AbortResult {
            revision: 13,
            replayed: false,
        };
        assert_eq!(
            text(&complete(&completed, Output::Text)),
            "completed (revision 12)\n"
        );
        assert_eq!(parsed(&complete(&completed, Output::Json))["revision"], 12);
        assert_eq!(
            text(&abort(&aborted, Output::Text)),
            "aborted (revision 13)\n"
        );
        let read = |state| IdempotencyGetResult {
            state,
            revision: 14,
            served_by: 2,
        };
        let found = read(Some(RecordState::Completed {
            result: vec![0xff],
            ttl_remaining: Duration::ZERO,
        }));
        assert_eq!(
            get(b"s", b"i", &found, Output::Text, ValueForm::Line).stdout,
            b"completed \xff\n"
        );
        assert_eq!(
            parsed(&get(b"s", b"i", &found, Output::Json, ValueForm::Line))["result"]["hex"],
            "ff"
        );
        let missing = get(b"pay", b"o-1", &read(None), Output::Text, ValueForm::Line);
        assert_eq!(
            missing.stderr,
            "no idempotency record \"o-1\" in scope \"pay\""
        );
        assert_eq!((missing.code, missing.stdout.is_empty()), (1, true));
        let missing = get(b"pay", b"o-1", &read(None), Output::Json, ValueForm::Line);
        assert_eq!(parsed(&missing)["state"], "none");
    }

    #[test]
    fn the_exact_form_is_the_result_alone_and_in_progress_exits_one() {
        let read = |state| IdempotencyGetResult {
            state,
            revision: 14,
            served_by: 2,
        };
        let ttl_remaining = Duration::from_secs(1);
        let done = read(Some(RecordState::Completed {
            result: vec![0xff, b'\n', 0],
            ttl_remaining,
        }));
        let busy = read(Some(RecordState::InProgress {
            owner: b"w1".to_vec(),
            ttl_remaining,
        }));
        let exact = |result| get(b"pay", b"o-1", result, Output::Text, ValueForm::Exact);
        assert_eq!(exact(&done), Report::ok(vec![0xff, b'\n', 0]));
        let report = exact(&busy);
        assert_eq!((report.stdout.is_empty(), report.code), (true, 1));
        assert_eq!(
            report.stderr,
            "idempotency record \"o-1\" in scope \"pay\" is in progress (owner \"w1\"); \
             it has no result yet"
        );
        let report = exact(&read(None));
        assert_eq!((report.stdout.is_empty(), report.code), (true, 1));
        assert_eq!(
            report.stderr,
            "no idempotency record \"o-1\" in scope \"pay\""
        );
    }
}
