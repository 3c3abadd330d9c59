//! What went wrong with one attempt of a request: the reverse of keel-server's status table,
//! plus the client-side failures (could not connect, sent and lost, timed out). Pure; knows
//! nothing of endpoints, leaders or retries.

use keel_proto::v1;
use keel_types::{KvError, NodeAddr};
use prost::Message;
use tonic::{Code, ConnectError, Status};

/// The failure of one attempt. The variants keep apart what the retry policy must tell apart:
/// whether the request can have reached a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptError {
    /// A server answered with this error: typed (an `ErrorDetail` in the status details) or
    /// mapped from a status code the server sent without details.
    Server(KvError),
    /// The client could not connect; nothing was sent.
    NotSent(String),
    /// The request may have reached a server, but the connection failed before an answer came.
    Lost(String),
    /// The request may have reached a server, but no answer came before the deadline.
    TimedOut(String),
    /// The request may have reached a server, but while no answer came another replica of
    /// its range named `leader` as the range's leader, so the attempt was given up to go
    /// there.
    Superseded { message: String, leader: NodeAddr },
}

impl std::fmt::Display for AttemptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttemptError::Server(error) => write!(f, "{error}"),
            AttemptError::NotSent(message) => write!(f, "could not connect: {message}"),
            AttemptError::Lost(message) => write!(f, "connection lost: {message}"),
            AttemptError::TimedOut(message) => write!(f, "no answer: {message}"),
            AttemptError::Superseded { message, .. } => write!(f, "no answer: {message}"),
        }
    }
}

/// Classifies a status returned by a tonic call.
///
/// - Details that decode to a `keel.v1.ErrorDetail` win: the server said exactly what happened.
/// - A status with a `source` was made on this side from a transport error. If a
///   `tonic::ConnectError` is in the chain, connecting failed and nothing was sent; any other
///   transport error may have hit after the request left, so the request is `Lost`.
/// - Otherwise the server sent the status without details; it is mapped by code.
pub fn from_status(status: &Status) -> AttemptError {
    if let Some(error) = detail(status) {
        return AttemptError::Server(error);
    }
    if let Some(source) = std::error::Error::source(status) {
        if chain_has_connect_error(source) {
            return AttemptError::NotSent(status.message().to_string());
        }
        return AttemptError::Lost(format!("{:?}: {}", status.code(), status.message()));
    }
    from_code(status.code(), status.message())
}

fn detail(status: &Status) -> Option<KvError> {
    if status.details().is_empty() {
        return None;
    }
    let detail = v1::ErrorDetail::decode(status.details()).ok()?;
    keel_proto::convert::kv_error(detail)
}

fn chain_has_connect_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.downcast_ref::<ConnectError>().is_some() {
            return true;
        }
        next = error.source();
    }
    false
}

/// A status a server sent without an `ErrorDetail` (a proxy, a non-Keel server, tonic's own
/// checks). Codes that say "nothing was done" map to errors the policy may retry; codes that
/// say nothing certain map to `Lost`.
fn from_code(code: Code, message: &str) -> AttemptError {
    let text = format!("server answered {code:?}: {message}");
    let error = match code {
        Code::InvalidArgument | Code::OutOfRange => KvError::invalid(text),
        Code::Unavailable | Code::ResourceExhausted | Code::Aborted => KvError::unavailable(text),
        Code::DeadlineExceeded | Code::Cancelled => KvError::Timeout { message: text },
        Code::Unimplemented
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::FailedPrecondition => KvError::fatal(text),
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => {
            return AttemptError::Lost(text);
        }
    };
    AttemptError::Server(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_types::{NodeAddr, RangeId};

    fn with_detail(code: Code, error: &KvError) -> Status {
        let bytes = v1::ErrorDetail::from(error).encode_to_vec();
        Status::with_details(code, "detailed", bytes.into())
    }

    #[test]
    fn typed_details_win_over_codes() {
        let not_leader = KvError::NotLeader {
            range_id: RangeId(1),
            leader: Some((2, NodeAddr::new("127.0.0.1:7002"))),
        };
        let lost = KvError::OutcomeUnknown {
            message: "leader changed".into(),
        };
        let cases = [
            (Code::FailedPrecondition, not_leader),
            (Code::Unknown, lost),
            (Code::Internal, KvError::fatal("disk")),
            (Code::InvalidArgument, KvError::invalid("key is empty")),
        ];
        for (code, error) in cases {
            let status = with_detail(code, &error);
            assert_eq!(from_status(&status), AttemptError::Server(error));
        }
    }

    #[test]
    fn codes_without_details_map_by_table() {
        fn kind(error: &AttemptError) -> &'static str {
            match error {
                AttemptError::Server(KvError::InvalidArgument { .. }) => "invalid",
                AttemptError::Server(KvError::Unavailable { .. }) => "unavailable",
                AttemptError::Server(KvError::Timeout { .. }) => "timeout",
                AttemptError::Server(KvError::Fatal { .. }) => "fatal",
                AttemptError::Server(_) => "other server error",
                AttemptError::NotSent(_) => "not sent",
                AttemptError::Lost(_) => "lost",
                AttemptError::TimedOut(_) | AttemptError::Superseded { .. } => "timed out",
            }
        }
        let cases = [
            (Code::InvalidArgument, "invalid"),
            (Code::OutOfRange, "invalid"),
            (Code::Unavailable, "unavailable"),
            (Code::ResourceExhausted, "unavailable"),
            (Code::Aborted, "unavailable"),
            (Code::DeadlineExceeded, "timeout"),
            (Code::Cancelled, "timeout"),
            (Code::Unimplemented, "fatal"),
            (Code::FailedPrecondition, "fatal"),
            (Code::Unknown, "lost"),
            (Code::Internal, "lost"),
            (Code::DataLoss, "lost"),
        ];
        for (code, expected) in cases {
            let status = Status::new(code, "plain");
            assert_eq!(kind(&from_status(&status)), expected, "{code:?}");
        }
    }

    #[test]
    fn garbage_details_fall_back_to_the_code() {
        let status = Status::with_details(Code::Unavailable, "x", vec![0xff, 0xff].into());
        assert!(matches!(
            from_status(&status),
            AttemptError::Server(KvError::Unavailable { .. })
        ));
    }

    #[test]
    fn connect_errors_are_not_sent_and_other_transport_errors_are_lost() {
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let connect = Status::from_error(Box::new(ConnectError(Box::new(refused))));
        assert_eq!(connect.code(), Code::Unavailable);
        assert!(matches!(from_status(&connect), AttemptError::NotSent(_)));

        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        let lost = Status::from_error(Box::new(reset));
        assert!(matches!(from_status(&lost), AttemptError::Lost(_)));
    }
}
