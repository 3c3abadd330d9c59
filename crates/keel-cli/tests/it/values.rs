//! Values of any size through real `keel` processes: `put`, `cas` and `idem complete` read
//! them from stdin (a file or a pipe), refused past their limit with nothing written, and
//! `get` gives their bytes back exactly to a pipe and with `--raw`.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use keel_types::limits;

use crate::process::Processes;

/// What the `keel` process reads on stdin.
enum Stdin<'a> {
    Null,
    File(&'a Path),
    /// Written by a thread while `keel` runs; `keel` may stop reading early.
    Pipe(Vec<u8>),
}

/// Runs `keel ARGS` against `processes`, stdout and stderr to pipes. The budget is wide: the
/// machine may be busy, and no test here is about time.
fn keel(processes: &Processes, args: &[&str], stdin: Stdin) -> Output {
    let endpoints: Vec<&str> = processes.endpoints.values().map(String::as_str).collect();
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["--endpoints", &endpoints.join(","), "--timeout-ms", "30000"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    match &stdin {
        Stdin::Null => command.stdin(Stdio::null()),
        Stdin::File(path) => command.stdin(std::fs::File::open(path).unwrap()),
        Stdin::Pipe(_) => command.stdin(Stdio::piped()),
    };
    let mut child = command.spawn().unwrap();
    let writer = match stdin {
        Stdin::Pipe(data) => {
            let mut pipe = child.stdin.take().unwrap();
            // A refused value ends `keel` before it read everything: a broken pipe is fine.
            Some(std::thread::spawn(move || {
                let _ = std::io::Write::write_all(&mut pipe, &data);
            }))
        }
        Stdin::Null | Stdin::File(_) => None,
    };
    let output = child.wait_with_output().unwrap();
    if let Some(writer) = writer {
        writer.join().unwrap();
    }
    output
}

/// Asserts `keel` exited with `code`, showing its stderr and the node logs if not.
#[track_caller]
fn assert_code(processes: &Processes, output: &Output, code: i32, what: &str) {
    assert_eq!(
        output.status.code(),
        Some(code),
        "{what}: {}; {}",
        String::from_utf8_lossy(&output.stderr),
        processes.logs()
    );
}

/// Every byte value, over and over: not UTF-8.
fn binary(length: usize) -> Vec<u8> {
    let data: Vec<u8> = (0..length).map(|i| (i % 256) as u8).collect();
    assert!(std::str::from_utf8(&data).is_err());
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_value_goes_in_from_stdin_and_comes_back_byte_identical() {
    let processes = Processes::start(3);
    processes.leader().await;
    let value = binary(300_000);
    let file = processes.dir.path().join("value.bin");
    std::fs::write(&file, &value).unwrap();

    let put = keel(&processes, &["put", "bin", "-"], Stdin::File(&file));
    assert_code(&processes, &put, 0, "put bin - < file");
    let get = keel(&processes, &["get", "bin"], Stdin::Null);
    assert_code(&processes, &get, 0, "get bin | ...");
    assert!(get.stdout == value, "get to a pipe changed the value");
    let raw = keel(&processes, &["get", "bin", "--raw"], Stdin::Null);
    assert_code(&processes, &raw, 0, "get bin --raw");
    assert!(raw.stdout == value, "get --raw changed the value");

    // No value at all, stdin a pipe: the pipe is the value.
    let piped = binary(300_001);
    let put = keel(&processes, &["put", "piped"], Stdin::Pipe(piped.clone()));
    assert_code(&processes, &put, 0, "... | put piped");
    let get = keel(&processes, &["get", "piped", "--raw"], Stdin::Null);
    assert_code(&processes, &get, 0, "get piped --raw");
    assert!(get.stdout == piped, "a piped value came back changed");

    // An argument still wins over stdin.
    let put = keel(&processes, &["put", "arg", "v"], Stdin::Pipe(piped));
    assert_code(&processes, &put, 0, "put arg v");
    let get = keel(&processes, &["get", "arg"], Stdin::Null);
    assert_eq!(get.stdout, b"v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_at_the_limit_is_stored_and_one_byte_more_is_refused_unwritten() {
    let processes = Processes::start(3);
    processes.leader().await;
    let largest = binary(limits::VALUE_BYTES_MAX);
    let put = keel(
        &processes,
        &["put", "max", "-"],
        Stdin::Pipe(largest.clone()),
    );
    assert_code(&processes, &put, 0, "put max - (the limit)");
    let get = keel(&processes, &["get", "max"], Stdin::Null);
    assert_code(&processes, &get, 0, "get max");
    assert!(get.stdout == largest, "the largest value came back changed");

    let file = processes.dir.path().join("over.bin");
    std::fs::write(&file, binary(limits::VALUE_BYTES_MAX + 1)).unwrap();
    for (args, stdin) in [
        (&["put", "over", "-"][..], Stdin::File(&file)),
        (
            &["put", "over"],
            Stdin::Pipe(binary(3 * limits::VALUE_BYTES_MAX)),
        ),
    ] {
        let refused = keel(&processes, args, stdin);
        assert_code(&processes, &refused, 2, "a value over the limit");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            stderr.contains("value on stdin is over its limit of 1 MiB (key \"over\")"),
            "{stderr}"
        );
        assert!(refused.stdout.is_empty());
    }
    for args in [&["get", "over"][..], &["get", "over", "--raw"]] {
        let get = keel(&processes, args, Stdin::Null);
        assert_code(&processes, &get, 1, "the refused key is absent");
        assert!(get.stdout.is_empty(), "{args:?} wrote to stdout");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cas_and_idem_complete_read_stdin() {
    let processes = Processes::start(3);
    processes.leader().await;
    let put = keel(&processes, &["put", "c", "old"], Stdin::Null);
    assert_code(&processes, &put, 0, "put c old");
    let new = binary(200_000);
    let cas = ["cas", "c", "-", "--expect-value", "old"];
    let swapped = keel(&processes, &cas, Stdin::Pipe(new.clone()));
    assert_code(&processes, &swapped, 0, "cas c - --expect-value old");
    let get = keel(&processes, &["get", "c"], Stdin::Null);
    assert!(get.stdout == new, "cas stored something else");
    // No NEW at all, stdin a pipe; then the same on a key that exists, refused.
    let cas = ["cas", "fresh", "--expect-absent"];
    let created = keel(&processes, &cas, Stdin::Pipe(new.clone()));
    assert_code(&processes, &created, 0, "... | cas fresh --expect-absent");
    let get = keel(&processes, &["get", "fresh"], Stdin::Null);
    assert!(get.stdout == new, "cas from a pipe stored something else");
    let put = keel(&processes, &["put", "small", "old"], Stdin::Null);
    assert_code(&processes, &put, 0, "put small old");
    let cas = ["cas", "small", "--expect-absent"];
    let failed = keel(&processes, &cas, Stdin::Pipe(new));
    assert_code(&processes, &failed, 1, "... | cas small --expect-absent");
    let get = keel(&processes, &["get", "small"], Stdin::Null);
    assert_eq!(get.stdout, b"old");

    let begin = ["idem", "begin", "pay", "o-1", "--ttl", "1h"];
    let started = keel(&processes, &begin, Stdin::Null);
    assert_code(&processes, &started, 0, "idem begin");
    let started = String::from_utf8(started.stdout).unwrap();
    let token = started.strip_prefix("started ").unwrap().trim_end();
    let complete = ["idem", "complete", "pay", "o-1", token];
    let over = binary(limits::IDEMPOTENCY_RESULT_BYTES_MAX + 1);
    let refused = keel(&processes, &complete, Stdin::Pipe(over));
    assert_code(&processes, &refused, 2, "idem complete over the limit");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("over its limit of 64 KiB"), "{stderr}");
    let raw = ["idem", "get", "pay", "o-1", "--raw"];
    let in_progress = keel(&processes, &raw, Stdin::Null);
    assert_code(&processes, &in_progress, 1, "idem get --raw in progress");
    assert!(in_progress.stdout.is_empty());

    let result = binary(limits::IDEMPOTENCY_RESULT_BYTES_MAX);
    let completed = keel(&processes, &complete, Stdin::Pipe(result.clone()));
    assert_code(&processes, &completed, 0, "... | idem complete");
    let got = keel(&processes, &raw, Stdin::Null);
    assert_code(&processes, &got, 0, "idem get --raw");
    assert!(got.stdout == result, "idem get --raw changed the result");
    let got = keel(&processes, &["idem", "get", "pay", "o-1"], Stdin::Null);
    let line = [b"completed ".as_slice(), &result, b"\n"].concat();
    assert!(got.stdout == line, "idem get lost its state word");
}
