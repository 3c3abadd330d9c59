//! Values that may come from stdin (`keel put KEY -`, as `etcdctl put` does): when stdin is
//! read instead of an argument, and reading it bounded by a limit. Knows nothing of clap or
//! of the network.

use std::ffi::OsStr;
use std::io::{IsTerminal, Read};
use std::os::unix::ffi::OsStrExt;

use keel_types::{KvError, limits};

/// Where a command's value (put, cas) or result (idem complete) comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    Argument(&'a OsStr),
    Stdin,
    /// Left out while stdin is a terminal: a usage error, so that a forgotten value does not
    /// leave the command waiting for typed input.
    Missing,
}

/// `-` reads stdin; so does leaving the argument out when stdin is not a terminal (a pipe, a
/// file, /dev/null). To store a lone `-`, pipe it in.
pub fn source(arg: Option<&OsStr>, stdin_is_terminal: bool) -> Source<'_> {
    match arg {
        Some(arg) if arg == "-" => Source::Stdin,
        Some(arg) => Source::Argument(arg),
        None if stdin_is_terminal => Source::Missing,
        None => Source::Stdin,
    }
}

/// Why `read_bounded` returned no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// There was more than the limit; what was read is dropped.
    OverLimit,
    Io(std::io::Error),
}

/// Reads `reader` to its end, refusing more than `limit` bytes. At most `limit + 1` bytes are
/// read, so an endless stream costs no more memory than a value at the limit.
pub fn read_bounded(reader: impl Read, limit: usize) -> Result<Vec<u8>, ReadError> {
    let mut data = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut data)
        .map_err(ReadError::Io)?;
    if data.len() > limit {
        return Err(ReadError::OverLimit);
    }
    Ok(data)
}

/// What is read, named in errors: `value` of `key "k"`, `result` of `idempotency record ...`.
pub struct Subject {
    pub what: &'static str,
    pub of: String,
}

/// The bytes of a value or result: its argument's, or stdin's (see `source`) up to `limit`.
/// Over the limit or unreadable is an invalid argument (exit 2), and nothing is sent.
pub fn read(arg: Option<&OsStr>, limit: usize, subject: &Subject) -> Result<Vec<u8>, KvError> {
    let stdin = std::io::stdin();
    match source(arg, stdin.is_terminal()) {
        Source::Argument(arg) => Ok(arg.as_bytes().to_vec()),
        // Read before any request is sent: blocking this thread holds nothing else up.
        Source::Stdin => {
            read_bounded(stdin.lock(), limit).map_err(|error| refused(error, limit, subject))
        }
        Source::Missing => unreachable!("args::check refuses a missing value before commands run"),
    }
}

fn refused(error: ReadError, limit: usize, subject: &Subject) -> KvError {
    let Subject { what, of } = subject;
    KvError::invalid(match error {
        ReadError::OverLimit => format!(
            "{what} on stdin is over its limit of {} ({of}); nothing was written",
            limits::human_bytes(limit)
        ),
        ReadError::Io(error) => format!("reading the {what} ({of}) from stdin: {error}"),
    })
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    #[test]
    fn dash_or_nothing_on_a_pipe_reads_stdin() {
        let value = OsStr::new("v");
        let dash = OsStr::new("-");
        let cases = [
            (Some(value), false, Source::Argument(value)),
            (Some(value), true, Source::Argument(value)),
            (Some(dash), false, Source::Stdin),
            (Some(dash), true, Source::Stdin),
            (None, false, Source::Stdin),
            (None, true, Source::Missing),
        ];
        for (arg, stdin_is_terminal, expected) in cases {
            assert_eq!(source(arg, stdin_is_terminal), expected, "{arg:?}");
        }
    }

    #[test]
    fn exactly_the_limit_is_read_and_one_byte_more_refused() {
        let limit = 1_000;
        let check = |length: usize, expected: Option<usize>| {
            let data: Vec<u8> = (0..length).map(|i| i as u8).collect();
            let got = match read_bounded(Cursor::new(&data), limit) {
                Ok(read) => {
                    assert_eq!(read, data);
                    Some(read.len())
                }
                Err(ReadError::OverLimit) => None,
                Err(ReadError::Io(error)) => panic!("{length} bytes: {error}"),
            };
            assert_eq!(got, expected, "{length} bytes");
        };
        check(0, Some(0));
        check(1, Some(1));
        check(limit - 1, Some(limit - 1));
        check(limit, Some(limit));
        check(limit + 1, None);
        check(3 * limit, None);
    }

    #[test]
    fn the_value_limit_itself_passes() {
        let limit = limits::VALUE_BYTES_MAX;
        let value = vec![0xff; limit];
        assert_eq!(
            read_bounded(Cursor::new(&value), limit).unwrap().len(),
            limit
        );
        let value = vec![0xff; limit + 1];
        let refused = read_bounded(Cursor::new(&value), limit);
        assert!(matches!(refused, Err(ReadError::OverLimit)), "{refused:?}");
    }

    #[test]
    fn no_more_than_one_byte_past_the_limit_is_read() {
        let data = vec![7; 10_000];
        let mut cursor = Cursor::new(&data);
        let refused = read_bounded(&mut cursor, 100);
        assert!(matches!(refused, Err(ReadError::OverLimit)), "{refused:?}");
        assert_eq!(cursor.position(), 101);
        // An endless stream ends at the limit too.
        let refused = read_bounded(std::io::repeat(1), limits::VALUE_BYTES_MAX);
        assert!(matches!(refused, Err(ReadError::OverLimit)), "{refused:?}");
    }

    /// Gives `data`, then fails.
    struct Broken<'a> {
        data: &'a [u8],
    }

    impl Read for Broken<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            if self.data.is_empty() {
                return Err(std::io::Error::other("the disk is on fire"));
            }
            let n = self.data.len().min(buf.len());
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_read_error_is_an_invalid_argument_naming_stdin() {
        let subject = Subject {
            what: "value",
            of: "key \"k\"".to_string(),
        };
        let error = match read_bounded(Broken { data: b"abc" }, 100) {
            Err(error @ ReadError::Io(_)) => refused(error, 100, &subject),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            error.to_string(),
            "invalid argument: reading the value (key \"k\") from stdin: the disk is on fire"
        );
        let error = refused(ReadError::OverLimit, limits::VALUE_BYTES_MAX, &subject);
        assert_eq!(
            error.to_string(),
            "invalid argument: value on stdin is over its limit of 1 MiB (key \"k\"); \
             nothing was written"
        );
    }
}
