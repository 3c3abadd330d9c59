//! The command line of `keel`, as clap derive types. Knows nothing of how commands run.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

use clap::builder::{OsStringValueParser, TypedValueParser};
use clap::error::ErrorKind;
use clap::{ArgGroup, Args, CommandFactory, Parser, Subcommand, ValueEnum};
use keel_types::{Condition, Consistency, Fence, KvError, NodeId, ReadBound, limits, validate};

use crate::output::Output;
use crate::{duration, input};

pub const ENDPOINTS_DEFAULT: &str = "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003";

/// The stdin rule of put, cas and idem complete (`input::source`), for their --help.
const STDIN_HELP: &str = "Stdin is read when the value is `-`, or when it is left out and \
                          stdin is not a terminal (`keel put KEY < FILE`, `producer | keel \
                          put KEY`); left out with stdin a terminal, it is a usage error. \
                          Stdin is read to its end and stored exactly, a final newline \
                          included; more than the limit (1 MiB for a value, 64 KiB for an \
                          idempotency result) is refused with exit 2 and nothing is written. \
                          To store a lone `-`, pipe it in: `printf %s - | keel put KEY`.";

#[derive(Debug, Parser)]
#[command(
    name = "keel",
    version,
    about = "Keel: a strongly consistent, Raft-replicated key-value store.",
    after_help = "Exit codes: 0 ok; 1 key not found (get), condition failed (cas), not a counter or \
                  overflow (incr), fenced out (a write whose lock was taken over), lock not \
                  acquired (lock acquire) or not held (renew, release), idempotency record not \
                  owned (complete, abort) or absent (idem get; with --raw, also in progress), \
                  split refused (the range changed meanwhile); 2 usage error or invalid \
                  argument (also a value or result on stdin over its limit, or an unreadable \
                  stdin: nothing is sent); \
                  3 unavailable, overloaded, timed out, outcome unknown (or request id expired \
                  while retrying) or fatal; 4 not allowed (no token or an unknown one, a call \
                  the token may not make, a tenant quota reached); 5 (serve) the node's data \
                  failed its checks at start: replace the node."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

/// Options of the client commands. Global so they may come before or after the command;
/// `serve` and `dev` ignore them.
#[derive(Debug, Args)]
#[command(next_help_heading = "Client options (ignored by serve and dev)")]
pub struct Global {
    /// Cluster endpoints (host:port), comma-separated.
    #[arg(
        long,
        global = true,
        env = "KEEL_ENDPOINTS",
        value_delimiter = ',',
        default_value = ENDPOINTS_DEFAULT
    )]
    pub endpoints: Vec<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// Budget of one request, retries included, in milliseconds. Writes are retried within
    /// it under one request id, so they are applied at most once.
    #[arg(long, global = true, default_value_t = 5_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_ms: u64,
    /// Bearer token sent with every request, for a cluster with authentication on (`keel
    /// serve --auth-tokens`); it names the tenant or admin you act as. Prefer the
    /// environment variable: a flag shows in the process list.
    #[arg(
        long = "token",
        global = true,
        env = "KEEL_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub auth_token: Option<String>,
    /// PEM file of the CA that signed the nodes' certificates: talk TLS to the cluster,
    /// trusting only this CA (a cluster serving TLS refuses plaintext). Without it,
    /// plaintext.
    #[arg(long, global = true, env = "KEEL_TLS_CA", value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one node until SIGTERM or SIGINT.
    Serve(Box<keel_server::ServeArgs>),
    /// Run a local cluster of child `keel serve` processes until Ctrl-C.
    Dev(DevArgs),
    /// Write a key; the value comes from VALUE or from stdin.
    #[command(after_help = STDIN_HELP)]
    Put {
        key: OsString,
        /// The value; `-` reads it from stdin, as does leaving it out when stdin is not a
        /// terminal.
        value: Option<OsString>,
        #[command(flatten)]
        ttl: TtlArg,
        #[command(flatten)]
        fence: FenceArg,
    },
    /// Read a key; text output is the value alone (raw bytes), with a newline only for a
    /// terminal, and the time left on stderr when the key has a TTL.
    #[command(
        after_help = "When stdout is not a terminal, or with --raw, the value's bytes are \
                      written exactly, with no newline added, so `keel get KEY > FILE` gives \
                      back what `keel put KEY - < FILE` stored. A missing key writes nothing \
                      to stdout (exit 1)."
    )]
    Get {
        key: OsString,
        /// How the read is made consistent.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Linearizable)]
        consistency: ConsistencyArg,
        #[command(flatten)]
        bound: BoundArg,
        #[command(flatten)]
        at: RevisionArg,
        /// Write the value's bytes exactly, with no newline, also to a terminal. Not with
        /// --output json.
        #[arg(long)]
        raw: bool,
    },
    /// Delete a key.
    Del {
        key: OsString,
        /// Without a fence, a delete also drops the key's fence (the way to retire a fenced
        /// key).
        #[command(flatten)]
        fence: FenceArg,
    },
    /// Write a key only if a condition holds (compare-and-set); the new value comes from NEW
    /// or from stdin.
    #[command(after_help = STDIN_HELP)]
    Cas(CasArgs),
    /// Add DELTA to the signed 64-bit decimal integer stored under KEY (absent = 0) and print
    /// the new value. Applied exactly once, also when retried.
    #[command(after_help = "A negative DELTA may be written directly or after --: \
                            `keel incr n -5`, `keel incr n -- -5`.")]
    Incr {
        key: OsString,
        /// Amount to add; negative to subtract.
        #[arg(default_value_t = 1, allow_negative_numbers = true)]
        delta: i64,
    },
    /// List keys of [START, END) in key order: `key<TAB>value` lines.
    Scan {
        /// First key (inclusive); empty or absent = the start of the keyspace.
        start: Option<OsString>,
        /// End key (exclusive); absent = the end of the keyspace.
        end: Option<OsString>,
        /// Most rows in total; pages are followed until it is reached.
        #[arg(long, default_value_t = limits::SCAN_LIMIT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// How each page is made consistent.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Linearizable)]
        consistency: ConsistencyArg,
        #[command(flatten)]
        bound: BoundArg,
        #[command(flatten)]
        at: RevisionArg,
    },
    /// List a key's changes, oldest first, from the history its range keeps:
    /// `revision<TAB>put<TAB>value` and `revision<TAB>delete` lines (a delete, or the removal
    /// of an expired key).
    #[command(
        after_help = "Each replica keeps a range's events for --history-retention-ms (1 hour \
                      by default) and up to --history-retention-bytes; asking from a \
                      revision no longer kept fails with `compacted` (exit 1) and names the \
                      first revision kept after."
    )]
    History {
        key: OsString,
        /// First revision to list (inclusive); 0 = the oldest kept.
        #[arg(long, default_value_t = 0)]
        from: u64,
        /// Most events in total; pages are followed until it is reached.
        #[arg(long, default_value_t = limits::HISTORY_LIMIT_DEFAULT, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
        /// How each page is made consistent.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Linearizable)]
        consistency: ConsistencyArg,
        #[command(flatten)]
        bound: BoundArg,
    },
    /// Stream the changes of the keys of [START, END) as they happen, across every range
    /// that holds them: `revision<TAB>put<TAB>key<TAB>value` and `revision<TAB>delete<TAB>key`
    /// lines (with --prev-kv, the value before as one more field when the key had one),
    /// until --count events or Ctrl-C (exit 0).
    #[command(
        after_help = "Splits, leader moves, node restarts and lost connections do not \
                      interrupt the stream: each event comes once, and a key's events in \
                      order; events of different ranges have no order between them. \
                      Revisions are per range, so --from suits a span one range holds. A \
                      watch from a revision no longer kept fails with `compacted` (exit 1)."
    )]
    Watch {
        /// First key (inclusive); with --prefix, the prefix of the keys to watch.
        start: OsString,
        /// End key (exclusive); absent = START alone (or, with --prefix, every key with
        /// that prefix).
        end: Option<OsString>,
        /// Watch every key that starts with START.
        #[arg(long, conflicts_with = "end")]
        prefix: bool,
        /// First revision to show (inclusive); 0 = changes from now on.
        #[arg(long, visible_alias = "rev", default_value_t = 0)]
        from: u64,
        /// Show each change's state before it too.
        #[arg(long)]
        prev_kv: bool,
        /// Stop after this many events.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
        /// Leave out puts (and increments).
        #[arg(long)]
        no_put: bool,
        /// Leave out deletes, expiries and reclaims.
        #[arg(long)]
        no_delete: bool,
        /// Also show the reclaims of free locks and expired idempotency records whose
        /// names lie in the watched span.
        #[arg(long)]
        reclaims: bool,
    },
    /// Locks with fencing tokens: acquire, renew, release, inspect.
    #[command(subcommand)]
    Lock(LockCommand),
    /// Idempotency records: run a piece of work at most once to completion.
    #[command(subcommand)]
    Idem(IdemCommand),
    /// Cluster administration.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Write a consistent snapshot of every data range, with its revision, to one file.
    #[command(
        after_help = "Each range's snapshot is consistent in itself (taken by its leader \
                            after confirming its leadership) and holds every write acknowledged \
                            before it was taken; ranges are taken one after another, so the \
                            backup is not one cluster-wide point in time. Progress is shown on \
                            stderr when it is a terminal. Restore it with `keel restore`."
    )]
    Backup {
        /// The backup file (written as FILE.tmp, fsynced, then renamed to FILE).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
    },
    /// Make the data dir of the first node of a new cluster from a backup file (offline; no
    /// cluster needs to run).
    #[command(
        after_help = "The file is verified first (checksums, lengths, counts, coverage \
                            of the keyspace); a damaged file is refused and DIR left as it was. \
                            Then start the node with `keel serve --node-id N --data-dir DIR \
                            --initial-cluster ...` and the other nodes, with empty data dirs, \
                            with the same --initial-cluster: the ranges reach them by snapshot. \
                            Exit codes: 0 restored; 2 refused (bad arguments, DIR not empty, \
                            damaged file); 3 failed writing DIR."
    )]
    Restore(keel_server::RestoreArgs),
}

#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Take a lock and print its fencing token (text: the token alone). Not acquired: the
    /// holder on stderr, exit 1.
    #[command(after_help = "Pass the token to the writes the lock protects: \
                            `keel put KEY VALUE --fence NAME:TOKEN`. A holder paused past its \
                            TTL may still believe it holds the lock; the fence makes the store \
                            refuse its writes once another holder has written.")]
    Acquire {
        name: OsString,
        /// How long the lock is held without a renew (500ms, 10s, 5m...): 1 ms to 1 year.
        #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        ttl: i64,
        /// How long to wait for a held lock (first come, first served); 0s tries once; at
        /// most 5m.
        #[arg(long, value_name = "DURATION", default_value = "0s", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        wait: i64,
        /// Who asks; default: unique to this process. The same owner acquiring a lock it
        /// holds gets its token back with a new TTL.
        #[arg(long)]
        owner: Option<OsString>,
        /// After this holder's TTL runs out (not after a release), nobody may take the lock
        /// for this long: 0s to 1m.
        #[arg(long, value_name = "DURATION", default_value = "0s", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        lock_delay: i64,
    },
    /// Extend a held lock to TTL from now.
    Renew {
        name: OsString,
        token: u64,
        /// The new TTL (500ms, 10s, 5m...): 1 ms to 1 year.
        #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        ttl: i64,
    },
    /// Free a lock, handing it to the first waiter if there is one.
    Release { name: OsString, token: u64 },
    /// Show who holds a lock, with its token and remaining TTL.
    Inspect {
        name: OsString,
        /// How the read is made consistent.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Linearizable)]
        consistency: ConsistencyArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum IdemCommand {
    /// Start a record (`started TOKEN`: do the work, then complete or abort it), or report
    /// it (`in-progress OWNER`, `completed RESULT`). An owner whose TTL ran out is taken
    /// over with a higher token.
    Begin {
        scope: OsString,
        id: OsString,
        /// How long the owner has to complete before another caller may take over: 1 ms to
        /// 1 year.
        #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        ttl: i64,
        /// Who does the work; default: unique to this process.
        #[arg(long)]
        owner: Option<OsString>,
    },
    /// Store the result of the work started with TOKEN (at most 64 KiB); it comes from
    /// RESULT or from stdin.
    #[command(after_help = STDIN_HELP)]
    Complete {
        scope: OsString,
        id: OsString,
        token: u64,
        /// The result; `-` reads it from stdin, as does leaving it out when stdin is not a
        /// terminal.
        result: Option<OsString>,
        /// How long the result is kept: 1 ms to 1 year.
        #[arg(long, value_name = "DURATION", default_value = "24h", allow_hyphen_values = true, value_parser = duration::parse_ms)]
        result_ttl: i64,
    },
    /// Drop the record started with TOKEN, so the next begin starts afresh.
    Abort {
        scope: OsString,
        id: OsString,
        token: u64,
    },
    /// Show a record: `in-progress OWNER` or `completed RESULT`; none: exit 1.
    Get {
        scope: OsString,
        id: OsString,
        /// How the read is made consistent.
        #[arg(long, value_enum, default_value_t = ConsistencyArg::Linearizable)]
        consistency: ConsistencyArg,
        /// Write the result's bytes alone, exactly, with no state word and no newline; a
        /// record still in progress writes nothing to stdout (its owner to stderr) and exits
        /// 1, as a missing one does. Not with --output json.
        #[arg(long)]
        raw: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// The nodes: state (active, draining, removed), liveness, replicas and leaders each
    /// holds, as the meta range's leader knows them. With --ranges: every endpoint's own view:
    /// whether it is healthy and ready (with the reason when not), and each range it hosts
    /// (role, leader, term, commit and applied index, revision).
    Status {
        /// Ask every endpoint for its view of each range it hosts instead.
        #[arg(long)]
        ranges: bool,
    },
    /// List the ranges in key order: id, span, epoch, replicas, leader, size in bytes, live
    /// keys, requests per second (from the meta range and the answering node).
    Ranges,
    /// Split the range holding KEY so that KEY starts a new range; prints both halves.
    #[command(
        after_help = "When KEY already starts a range, prints the two halves it \
                            separates and changes nothing (so a retry is safe). Refused \
                            (exit 1) when the range changed meanwhile. A split whose answer \
                            was lost exits 3; `keel cluster ranges` shows whether it happened."
    )]
    Split {
        /// The first key of the new range.
        #[arg(long, value_name = "KEY")]
        at: OsString,
    },
    /// Register a node with the cluster as active, so that it gets replicas (a node started
    /// with `keel serve --join` registers itself).
    AddNode {
        #[arg(long)]
        node_id: NodeId,
        /// The address peers and clients use for it ("host:port").
        #[arg(long)]
        addr: String,
    },
    /// Drain a node: its replicas and leaderships move to other nodes, then it is marked
    /// removed and may be stopped. Waits until then, printing progress.
    #[command(
        after_help = "Refused (exit 2) when fewer active nodes than the replication factor                       would remain. Exits 3 if the wait runs out first; the drain goes on."
    )]
    RemoveNode {
        node_id: NodeId,
        /// Return once draining has started.
        #[arg(long)]
        no_wait: bool,
        /// How long to wait for the drain, in seconds.
        #[arg(long, default_value_t = 1800)]
        wait_secs: u64,
    },
    /// Ask the leader of RANGE to hand leadership to its voter NODE.
    TransferLeader { range: u64, node: NodeId },
    /// Check now that the replicas of each range agree: every replica hashes the range at
    /// one log index and the range's leader compares. Prints per range the index, each
    /// replica's hash, the verdict, and the rows a differing replica differs in.
    #[command(
        after_help = "Verdicts: consistent (every replica answered the same hash), unconfirmed \
                      (no two differ, but a replica gave no hash: the reason is shown), divergent \
                      (a majority agrees; the others differ, with the rows they differ in), \
                      no-majority (hashes differ and none has a majority). Exits 1 when a range \
                      is divergent or has no majority, 3 when a range could not be checked."
    )]
    Check {
        /// Check this range only (an id from `keel cluster ranges`; 0 is the meta range).
        #[arg(long)]
        range: Option<u64>,
        /// How long to wait for the answer, in seconds (a check hashes every replica at
        /// 32 MiB/s at most).
        #[arg(long, default_value_t = 600)]
        wait_secs: u64,
    },
}

#[derive(Debug, Args)]
pub struct DevArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=limits::CLUSTER_NODES_MAX as i64))]
    pub nodes: u16,
    /// Data directory (node-<i>/ inside it); default: a new directory under the system temp dir.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Port of node 1; node i listens on base-port + i - 1, and serves its metrics and the
    /// console on 2100 above that (9101 for 7001).
    #[arg(long, default_value_t = 7001, value_parser = clap::value_parser!(u16).range(1..))]
    pub base_port: u16,
    /// Serve TLS only, with a throwaway CA and one certificate per node made under
    /// DATA_DIR/tls (made anew on each start; keys mode 0600); clients then need
    /// --tls-ca DATA_DIR/tls/ca.pem (or KEEL_TLS_CA). For local use only.
    #[arg(long)]
    pub tls: bool,
}

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("expect").required(true).multiple(false)))]
pub struct CasArgs {
    pub key: OsString,
    /// The value to write; `-` reads it from stdin, as does leaving it out when stdin is not
    /// a terminal.
    pub new: Option<OsString>,
    /// The key must currently have this value.
    #[arg(long, group = "expect")]
    pub expect_value: Option<OsString>,
    /// The key must currently have this mod revision.
    #[arg(long, group = "expect")]
    pub expect_revision: Option<u64>,
    /// The key must currently be absent.
    #[arg(long, group = "expect")]
    pub expect_absent: bool,
    #[command(flatten)]
    pub ttl: TtlArg,
    #[command(flatten)]
    pub fence: FenceArg,
}

/// `--fence` of the writes that take one.
#[derive(Debug, Args)]
pub struct FenceArg {
    /// Guard the write with a lock: its name and the token `keel lock acquire` printed. The
    /// key then refuses lower tokens of that lock (exit 1, fenced out).
    #[arg(long, value_name = "NAME:TOKEN", value_parser = OsStringValueParser::new().try_map(parse_fence))]
    pub fence: Option<Fence>,
}

/// `--max-staleness` and `--min-revision` of the reads.
#[derive(Debug, Args)]
pub struct BoundArg {
    /// With --consistency follower: read from a replica known current with its leader less
    /// than this long ago (0s to 1d; an older one catches up first, or the read fails).
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_ms)]
    pub max_staleness: Option<i64>,
    /// Read a state that includes this revision (one an earlier answer printed); a revision
    /// the range has not reached fails (exit 1).
    #[arg(long, value_name = "REVISION")]
    pub min_revision: Option<u64>,
}

impl BoundArg {
    /// The bound, checked against its limits.
    pub fn bound(&self) -> Result<ReadBound, KvError> {
        validate::check_read_bound(self.max_staleness, self.min_revision)
    }
}

/// `--revision` of the reads that can read an earlier state.
#[derive(Debug, Args)]
pub struct RevisionArg {
    /// Read as the range was at this revision (one an answer or `keel history` printed): a
    /// revision whose later changes the serving replica no longer keeps fails with
    /// `compacted` (exit 1). Revisions count per range: a scan across ranges reads each at
    /// its own revision of that number.
    #[arg(
        long,
        value_name = "REVISION",
        value_parser = clap::value_parser!(u64).range(1..),
        conflicts_with_all = ["max_staleness", "min_revision"]
    )]
    pub revision: Option<u64>,
}

/// `--ttl` of the writes that take one.
#[derive(Debug, Args)]
pub struct TtlArg {
    /// Time to live: a whole number and a unit (500ms, 30s, 5m, 2h, 1d), 1 ms to 1 year.
    /// Without it the key has no TTL, and a TTL it had is cleared.
    #[arg(long, value_name = "DURATION", allow_hyphen_values = true, value_parser = duration::parse_ms)]
    pub ttl: Option<i64>,
}

impl CasArgs {
    pub fn condition(&self) -> Condition {
        match (&self.expect_value, self.expect_revision) {
            (Some(value), _) => Condition::Value(bytes(value)),
            (None, Some(revision)) => Condition::Revision(revision),
            (None, None) => Condition::Absent,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyArg {
    /// The leader confirms its leadership with a quorum first.
    Linearizable,
    /// The leader reads under its lease; relies on bounded clock drift.
    Lease,
    /// Any replica reads its applied state; may be stale.
    Follower,
}

impl From<ConsistencyArg> for Consistency {
    fn from(consistency: ConsistencyArg) -> Self {
        match consistency {
            ConsistencyArg::Linearizable => Consistency::Linearizable,
            ConsistencyArg::Lease => Consistency::Lease,
            ConsistencyArg::Follower => Consistency::Follower,
        }
    }
}

/// Usage errors clap cannot see, with clap's format and exit code 2: a value left out while
/// stdin is a terminal (`input::source`), and `--raw` with `--output json`.
pub fn check(cli: &Cli, stdin_is_terminal: bool) -> Result<(), clap::Error> {
    let raw = |path: &[&str]| {
        let message = "--raw writes the bytes alone; it cannot be used with --output json";
        match cli.global.output {
            Output::Json => Err(usage_error(path, ErrorKind::ArgumentConflict, message)),
            Output::Text => Ok(()),
        }
    };
    let (path, arg, name): (&[&str], _, _) = match &cli.command {
        Command::Put { value, .. } => (&["put"], value, "VALUE"),
        Command::Cas(cas) => (&["cas"], &cas.new, "NEW"),
        Command::Idem(IdemCommand::Complete { result, .. }) => {
            (&["idem", "complete"], result, "RESULT")
        }
        Command::Get { raw: true, .. } => return raw(&["get"]),
        Command::Idem(IdemCommand::Get { raw: true, .. }) => return raw(&["idem", "get"]),
        _ => return Ok(()),
    };
    match input::source(arg.as_deref(), stdin_is_terminal) {
        input::Source::Missing => Err(usage_error(
            path,
            ErrorKind::MissingRequiredArgument,
            &format!(
                "<{name}> is missing and stdin is a terminal: give <{name}>, pipe it in, or \
                 pass - to type it (end with Ctrl-D)"
            ),
        )),
        input::Source::Argument(_) | input::Source::Stdin => Ok(()),
    }
}

/// A usage error of the subcommand at `path`, shown with its usage line.
fn usage_error(path: &[&str], kind: ErrorKind, message: &str) -> clap::Error {
    let mut command = Cli::command();
    command.build();
    let mut command = &mut command;
    for name in path {
        command = command
            .find_subcommand_mut(name)
            .expect("check names only subcommands that exist");
    }
    command.error(kind, message)
}

/// An argument's raw bytes: keys and values need not be UTF-8.
pub fn bytes(arg: &OsString) -> Vec<u8> {
    arg.clone().into_vec()
}

/// `NAME:TOKEN`, split at the last colon (names may hold colons). The limits (name length,
/// a token of at least 1) are checked by `keel_types::validate`, with its messages.
fn parse_fence(arg: OsString) -> Result<Fence, String> {
    let arg = arg.into_vec();
    let shown = String::from_utf8_lossy(&arg).into_owned();
    let Some(colon) = arg.iter().rposition(|&byte| byte == b':') else {
        return Err(format!("{shown:?} is not NAME:TOKEN"));
    };
    let token = std::str::from_utf8(&arg[colon + 1..])
        .ok()
        .and_then(|token| token.parse::<u64>().ok())
        .ok_or_else(|| format!("{shown:?} is not NAME:TOKEN; the token is a whole number"))?;
    Ok(Fence {
        lock: arg[..colon].to_vec(),
        token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("keel").chain(args.iter().copied()))
    }

    #[test]
    fn command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn cas_needs_exactly_one_expectation() {
        let condition = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Cas(cas)) => Ok(cas.condition()),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(error) => Err(error.kind()),
        };
        let cases: Vec<(&[&str], Result<Condition, ErrorKind>)> = vec![
            (
                &["cas", "k", "v", "--expect-value", "old"],
                Ok(Condition::Value(b"old".to_vec())),
            ),
            (
                &["cas", "k", "v", "--expect-revision", "7"],
                Ok(Condition::Revision(7)),
            ),
            (&["cas", "k", "v", "--expect-absent"], Ok(Condition::Absent)),
            (&["cas", "k", "v"], Err(ErrorKind::MissingRequiredArgument)),
            (
                &["cas", "k", "v", "--expect-absent", "--expect-revision", "7"],
                Err(ErrorKind::ArgumentConflict),
            ),
        ];
        for (args, expected) in cases {
            assert_eq!(condition(args), expected, "{args:?}");
        }
    }

    #[test]
    fn global_options_go_anywhere_and_endpoints_split_on_commas() {
        let cli = parse(&["get", "k", "--endpoints", "a:1,b:2", "--output", "json"]).unwrap();
        assert_eq!(cli.global.endpoints, ["a:1", "b:2"]);
        assert_eq!(cli.global.output, Output::Json);
        let cli = parse(&["--consistency", "follower", "get", "k"]);
        assert!(cli.is_err(), "--consistency belongs to get, not to keel");
    }

    #[test]
    fn reads_take_a_staleness_bound_and_a_revision_checked_against_their_limits() {
        let bound = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(
                Command::Get { bound, .. }
                | Command::Scan { bound, .. }
                | Command::History { bound, .. },
            ) => bound.bound(),
            other => panic!("parsed as {other:?}"),
        };
        let get = ["get", "k", "--consistency", "follower"];
        let args = [&get[..], &["--max-staleness", "2s", "--min-revision", "7"]].concat();
        let expected = ReadBound {
            max_staleness_ms: Some(2_000),
            min_revision: Some(7),
        };
        assert_eq!(bound(&args), Ok(expected));
        assert_eq!(bound(&get), Ok(ReadBound::default()));
        let scan = ["scan", "a", "b", "--max-staleness", "0s"];
        assert_eq!(bound(&scan).unwrap().max_staleness_ms, Some(0));
        for over in ["-1s", "2d"] {
            let args = [&get[..], &["--max-staleness", over]].concat();
            let refused = bound(&args).expect_err(over);
            assert!(
                refused.to_string().contains("max_staleness_ms"),
                "{refused}"
            );
        }
    }

    #[test]
    fn get_and_scan_read_at_a_revision_alone() {
        let revision = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Get { at, .. } | Command::Scan { at, .. }) => Ok(at.revision),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(error) => Err(error.kind()),
        };
        assert_eq!(revision(&["get", "k", "--revision", "5"]), Ok(Some(5)));
        assert_eq!(revision(&["scan", "a", "--revision", "5"]), Ok(Some(5)));
        assert_eq!(revision(&["get", "k"]), Ok(None));
        let zero = revision(&["get", "k", "--revision", "0"]);
        assert_eq!(zero, Err(ErrorKind::ValueValidation));
        let both = revision(&["get", "k", "--revision", "5", "--min-revision", "3"]);
        assert_eq!(both, Err(ErrorKind::ArgumentConflict));
    }

    #[test]
    fn incr_takes_an_optional_possibly_negative_delta() {
        let check = |args: &[&str], expected: Result<i64, ErrorKind>| {
            let got = match parse(args).map(|cli| cli.command) {
                Ok(Command::Incr { key, delta }) => {
                    assert_eq!(bytes(&key), b"n");
                    Ok(delta)
                }
                Ok(other) => panic!("parsed as {other:?}"),
                Err(error) => Err(error.kind()),
            };
            assert_eq!(got, expected, "{args:?}");
        };
        check(&["incr", "n"], Ok(1));
        check(&["incr", "n", "7"], Ok(7));
        check(&["incr", "n", "-5"], Ok(-5));
        check(&["incr", "n", "--", "-5"], Ok(-5));
        check(&["incr", "n", "-5", "--output", "json"], Ok(-5));
        check(&["incr", "n", "-9223372036854775808"], Ok(i64::MIN));
        let invalid = Err(ErrorKind::ValueValidation);
        check(&["incr", "n", "9223372036854775808"], invalid);
        check(&["incr", "n", "x"], invalid);
        check(&["incr", "n", "1.5"], invalid);
        check(&["incr"], Err(ErrorKind::MissingRequiredArgument));
    }

    #[test]
    fn put_and_cas_take_a_ttl_with_a_unit() {
        let ttl = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Put { ttl, .. }) => Ok(ttl.ttl),
            Ok(Command::Cas(cas)) => Ok(cas.ttl.ttl),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(error) => Err(error.to_string()),
        };
        let parses = |args: &[&str], expected: Option<i64>| {
            assert_eq!(ttl(args), Ok(expected), "{args:?}");
        };
        let refuses = |args: &[&str], expected: &str| {
            let message = ttl(args).unwrap_err();
            assert!(message.contains(expected), "{args:?}: {message}");
        };
        parses(&["put", "k", "v"], None);
        parses(&["put", "k", "v", "--ttl", "30s"], Some(30_000));
        parses(&["put", "k", "v", "--ttl=500ms"], Some(500));
        parses(&["put", "--ttl", "1d", "k", "v"], Some(86_400_000));
        parses(
            &["cas", "k", "v", "--expect-absent", "--ttl", "5m"],
            Some(300_000),
        );
        // Zero and negative parse; the limit check refuses them with its own message.
        parses(&["put", "k", "v", "--ttl", "0s"], Some(0));
        parses(&["put", "k", "v", "--ttl", "-5s"], Some(-5_000));
        refuses(&["put", "k", "v", "--ttl", "30"], "has no unit");
        refuses(&["put", "k", "v", "--ttl", "soon"], "is not a duration");
    }

    #[test]
    fn fences_are_name_colon_token() {
        let fence = |args: &[&str]| match parse(args).map(|cli| cli.command) {
            Ok(Command::Put { fence, .. } | Command::Del { fence, .. }) => Ok(fence.fence),
            Ok(Command::Cas(cas)) => Ok(cas.fence.fence),
            Ok(other) => panic!("parsed as {other:?}"),
            Err(error) => Err(error.to_string()),
        };
        let lock = |name: &str, token| {
            Ok(Some(Fence {
                lock: name.as_bytes().to_vec(),
                token,
            }))
        };
        assert_eq!(fence(&["put", "k", "v"]), Ok(None));
        assert_eq!(
            fence(&["put", "k", "v", "--fence", "jobs:5"]),
            lock("jobs", 5)
        );
        assert_eq!(fence(&["del", "k", "--fence", "a:b:7"]), lock("a:b", 7));
        let cas = ["cas", "k", "v", "--expect-absent", "--fence", "jobs:9"];
        assert_eq!(fence(&cas), lock("jobs", 9));
        // Limits are the client's to check: an empty name and token 0 parse.
        assert_eq!(fence(&["put", "k", "v", "--fence", ":0"]), lock("", 0));
        for (bad, message) in [
            ("jobs", "is not NAME:TOKEN"),
            ("jobs:", "the token is a whole number"),
            ("jobs:-1", "the token is a whole number"),
            ("jobs:x", "the token is a whole number"),
        ] {
            let error = fence(&["put", "k", "v", "--fence", bad]).unwrap_err();
            assert!(error.contains(message), "{bad}: {error}");
        }
    }

    #[test]
    fn the_bearer_token_is_apart_from_lock_and_record_tokens() {
        let args = [
            "--token",
            "t0123456789abcdef",
            "lock",
            "renew",
            "jobs",
            "5",
            "--ttl",
            "1s",
        ];
        let cli = parse(&args).unwrap();
        assert_eq!(cli.global.auth_token.as_deref(), Some("t0123456789abcdef"));
        let Command::Lock(LockCommand::Renew { token, .. }) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(token, 5);
        let cli = parse(&["idem", "complete", "pay", "o-1", "9", "done"]).unwrap();
        assert_eq!(cli.global.auth_token, None);
    }

    #[test]
    fn lock_and_idem_commands_take_durations_with_units() {
        let cli = parse(&["lock", "acquire", "jobs", "--ttl", "10s", "--wait", "5s"]).unwrap();
        let Command::Lock(LockCommand::Acquire {
            name,
            ttl,
            wait,
            owner,
            lock_delay,
        }) = cli.command
        else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(bytes(&name), b"jobs");
        assert_eq!((ttl, wait, lock_delay, owner), (10_000, 5_000, 0, None));
        let cli = parse(&["idem", "complete", "pay", "o-1", "9", "done"]).unwrap();
        let Command::Idem(IdemCommand::Complete {
            token, result_ttl, ..
        }) = cli.command
        else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!((token, result_ttl), (9, 86_400_000));
        for args in [
            &["lock", "acquire", "jobs"][..],
            &["lock", "renew", "jobs", "5"],
            &["lock", "release", "jobs", "x"],
            &["idem", "begin", "pay", "o-1", "--ttl", "30"],
        ] {
            assert_eq!(parse(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn cluster_split_takes_its_key_with_at() {
        let cli = parse(&["cluster", "split", "--at", "k0100"]).unwrap();
        let Command::Cluster(ClusterCommand::Split { at }) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!(bytes(&at), b"k0100");
        let cli = parse(&["cluster", "ranges", "--output", "json"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Cluster(ClusterCommand::Ranges)
        ));
        assert_eq!(cli.global.output, Output::Json);
        for args in [&["cluster", "split"][..], &["cluster", "split", "k0100"]] {
            assert_eq!(parse(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn cluster_membership_commands_parse() {
        let cli = parse(&["cluster", "add-node", "--node-id", "4", "--addr", "h:7004"]).unwrap();
        let Command::Cluster(ClusterCommand::AddNode { node_id, addr }) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!((node_id, addr.as_str()), (4, "h:7004"));
        let cli = parse(&["cluster", "remove-node", "3", "--no-wait"]).unwrap();
        let Command::Cluster(ClusterCommand::RemoveNode {
            node_id,
            no_wait,
            wait_secs,
        }) = cli.command
        else {
            panic!("parsed as {:?}", cli.command);
        };
        assert_eq!((node_id, no_wait, wait_secs), (3, true, 1800));
        let cli = parse(&["cluster", "transfer-leader", "7", "2"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Cluster(ClusterCommand::TransferLeader { range: 7, node: 2 })
        ));
        let cli = parse(&["cluster", "status", "--ranges"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Cluster(ClusterCommand::Status { ranges: true })
        ));
        for args in [
            &["cluster", "add-node", "--node-id", "4"][..],
            &["cluster", "remove-node"],
            &["cluster", "transfer-leader", "7"],
            &["cluster", "remove-node", "x"],
        ] {
            assert_eq!(parse(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
    }

    #[test]
    fn a_value_left_out_is_read_from_stdin_unless_it_is_a_terminal() {
        let check = |args: &[&str], stdin_is_terminal| {
            let cli = parse(args).unwrap();
            check(&cli, stdin_is_terminal).map_err(|error| {
                assert_eq!(error.exit_code(), 2, "{args:?}");
                (error.kind(), error.render().to_string())
            })
        };
        let missing = [
            (&["put", "k"][..], "<VALUE>", "Usage: keel put"),
            (&["cas", "k", "--expect-absent"], "<NEW>", "Usage: keel cas"),
            (
                &["idem", "complete", "pay", "o-1", "9"],
                "<RESULT>",
                "Usage: keel idem complete",
            ),
        ];
        for (args, name, usage) in missing {
            assert_eq!(check(args, false), Ok(()), "{args:?}");
            let (kind, message) = check(args, true).unwrap_err();
            assert_eq!(kind, ErrorKind::MissingRequiredArgument, "{args:?}");
            assert!(message.contains(&format!("{name} is missing")), "{message}");
            assert!(message.contains(usage), "{message}");
        }
        for args in [
            &["put", "k", "v"][..],
            &["put", "k", "-"],
            &["put", "k", "--ttl", "5s", "-"],
            &["cas", "k", "-", "--expect-revision", "3"],
            &["idem", "complete", "pay", "o-1", "9", "-"],
        ] {
            assert_eq!(check(args, true), Ok(()), "{args:?}");
            assert_eq!(check(args, false), Ok(()), "{args:?}");
        }
    }

    #[test]
    fn raw_refuses_json_output() {
        for (args, refused) in [
            (&["get", "k", "--raw"][..], false),
            (&["get", "k", "--raw", "--output", "text"], false),
            (&["get", "k", "--output", "json"], false),
            (&["get", "k", "--raw", "--output", "json"], true),
            (&["--output", "json", "get", "k", "--raw"], true),
            (&["idem", "get", "pay", "o-1", "--raw"], false),
            (
                &["idem", "get", "pay", "o-1", "--raw", "--output", "json"],
                true,
            ),
        ] {
            let result = check(&parse(args).unwrap(), true);
            assert_eq!(result.is_err(), refused, "{args:?}");
            if let Err(error) = result {
                assert_eq!(error.kind(), ErrorKind::ArgumentConflict);
                assert_eq!(error.exit_code(), 2);
            }
        }
    }

    #[test]
    fn the_stdin_help_names_the_limits() {
        for limit in [
            limits::VALUE_BYTES_MAX,
            limits::IDEMPOTENCY_RESULT_BYTES_MAX,
        ] {
            let limit = limits::human_bytes(limit);
            assert!(STDIN_HELP.contains(&limit), "{limit}: {STDIN_HELP}");
        }
    }

    #[test]
    fn usage_errors_exit_with_two() {
        for args in [
            &["get"][..],
            &["scan", "--limit", "0"],
            &["dev", "--nodes", "0"],
            &["put", "k", "v", "--ttl", "30"],
            &["incr", "n", "one"],
            &["nope"],
        ] {
            assert_eq!(parse(args).unwrap_err().exit_code(), 2, "{args:?}");
        }
    }
}
