//! The client commands: call keel-client, hand the results to `output`, print. Knows nothing
//! of servers; formatting and exit codes live in `output`. The lock and idempotency
//! commands are in `lock` and `idem`, `backup` in `backup`.

use std::ffi::OsStr;
use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::time::Duration;

use keel_client::{Client, ClientOptions, ClientTls, DeleteOptions, PutOptions, WatchOptions};
use keel_types::{Consistency, KvError, NodeId, RangeId, ReadBound, Revision, limits, validate};

use crate::args::{ClusterCommand, Command, Global, TtlArg, bytes};
use crate::input;
use crate::output::{self, Output, Report, StatusRow, code};

mod backup;
mod idem;
mod lock;

/// Runs one client command, prints its output, and returns the exit code.
pub async fn run(global: &Global, command: Command) -> u8 {
    let report = match report(global, command).await {
        Ok(report) => report,
        Err(error) => output::error(&error, global.output),
    };
    print(&report)
}

pub fn print(report: &Report) -> u8 {
    // A closed pipe (`keel scan | head`) is not an error of the command.
    let _ = std::io::stdout().lock().write_all(&report.stdout);
    let _ = std::io::stdout().flush();
    if !report.stderr.is_empty() {
        eprintln!("{}", report.stderr);
    }
    report.code
}

/// `--timeout-ms` bounds reads and writes alike; a write attempt gets at most half of it, so
/// that a write whose first attempt hangs is sent once more (with the same request id).
/// `--tls-ca` is read here: a file that cannot be read is an invalid argument.
fn options(global: &Global) -> Result<ClientOptions, KvError> {
    let timeout = Duration::from_millis(global.timeout_ms);
    let defaults = ClientOptions::default();
    let tls = global.tls_ca.as_deref().map(client_tls).transpose()?;
    Ok(ClientOptions {
        request_timeout: timeout,
        read_attempt_timeout: defaults.read_attempt_timeout.min(timeout),
        write_deadline: timeout,
        write_attempt_timeout: defaults.write_attempt_timeout.min(timeout / 2),
        connect_timeout: defaults.connect_timeout.min(timeout),
        token: global.auth_token.clone(),
        tls,
        ..defaults
    })
}

/// TLS trusting the CA in the PEM file `path` (at most `TLS_PEM_BYTES_MAX`).
pub fn client_tls(path: &Path) -> Result<ClientTls, KvError> {
    let invalid = |why: String| KvError::invalid(format!("--tls-ca {}: {why}", path.display()));
    let file = std::fs::File::open(path).map_err(|e| invalid(e.to_string()))?;
    let limit = limits::TLS_PEM_BYTES_MAX;
    let mut ca_pem = Vec::new();
    file.take(limit as u64 + 1)
        .read_to_end(&mut ca_pem)
        .map_err(|e| invalid(e.to_string()))?;
    if ca_pem.len() > limit {
        return Err(invalid(format!(
            "longer than {}, the limit of a PEM file",
            limits::human_bytes(limit)
        )));
    }
    Ok(ClientTls {
        ca_pem,
        server_name: None,
    })
}

/// The value of put or cas: its argument, or stdin up to the value limit. The key is checked
/// first, so that a bad key leaves stdin unread.
fn put_value(arg: Option<&OsStr>, key: &[u8]) -> Result<Vec<u8>, KvError> {
    validate::check_key(key)?;
    let subject = input::Subject {
        what: "value",
        of: format!("key {}", validate::show_key(key)),
    };
    input::read(arg, limits::VALUE_BYTES_MAX, &subject)
}

/// The TTL of `--ttl`, checked against the limits before anything is sent, with the
/// message the cluster would give.
fn ttl(key: &[u8], arg: &TtlArg) -> Result<Option<Duration>, KvError> {
    arg.ttl
        .map(|ttl_ms| validate::check_ttl_ms(key, ttl_ms).map(Duration::from_millis))
        .transpose()
}

async fn report(global: &Global, command: Command) -> Result<Report, KvError> {
    let client = Client::new(global.endpoints.clone(), options(global)?)?;
    let out = global.output;
    match command {
        Command::Put {
            key,
            value,
            ttl: arg,
            fence,
        } => {
            let key = bytes(&key);
            let options = PutOptions {
                ttl: ttl(&key, &arg)?,
                fence: fence.fence,
                ..PutOptions::default()
            };
            let value = put_value(value.as_deref(), &key)?;
            let result = client.put(&key, &value, options).await?;
            Ok(output::put(&result, out))
        }
        Command::Get {
            key,
            consistency,
            bound,
            at,
            raw,
        } => {
            let key = bytes(&key);
            let result = match at.revision {
                Some(revision) => client.get_at(&key, revision, consistency.into()).await?,
                None => {
                    client
                        .get_within(&key, consistency.into(), bound.bound()?)
                        .await?
                }
            };
            let form = output::value_form(raw, std::io::stdout().is_terminal());
            Ok(output::get(&key, &result, out, form))
        }
        Command::Del { key, fence } => {
            let key = bytes(&key);
            let options = DeleteOptions {
                fence: fence.fence,
                ..DeleteOptions::default()
            };
            let result = client.delete(&key, options).await?;
            Ok(output::delete(&key, &result, out))
        }
        Command::Cas(cas) => {
            let key = bytes(&cas.key);
            let options = PutOptions {
                condition: Some(cas.condition()),
                return_previous: false,
                ttl: ttl(&key, &cas.ttl)?,
                fence: cas.fence.fence,
            };
            let value = put_value(cas.new.as_deref(), &key)?;
            let result = client.put(&key, &value, options).await?;
            Ok(output::put(&result, out))
        }
        Command::Incr { key, delta } => {
            let key = bytes(&key);
            let result = client.increment(&key, delta).await?;
            Ok(output::increment(&key, &result, out))
        }
        Command::Scan {
            start,
            end,
            limit,
            consistency,
            bound,
            at,
        } => {
            let start = start.as_ref().map(bytes).unwrap_or_default();
            let end = end.as_ref().map(bytes).unwrap_or_default();
            let read = (consistency.into(), bound.bound()?, at.revision);
            scan(&client, (start, end), limit, read, out).await
        }
        Command::History {
            key,
            from,
            limit,
            consistency,
            bound,
        } => {
            let read = (consistency.into(), bound.bound()?);
            history(&client, &bytes(&key), from, limit, read, out).await
        }
        Command::Watch {
            start,
            end,
            prefix,
            from,
            prev_kv,
            count,
            no_put,
            no_delete,
            reclaims,
        } => {
            let start = bytes(&start);
            let end = match (prefix, end) {
                (true, _) => prefix_end(&start),
                (false, Some(end)) => bytes(&end),
                (false, None) => [start.as_slice(), &[0]].concat(),
            };
            let options = WatchOptions {
                start_revision: from,
                prev_kv,
                no_put,
                no_delete,
                reclaims,
                progress_interval: None,
            };
            watch(&client, (&start, &end), options, count, out).await
        }
        Command::Lock(command) => lock::run(&client, command, out).await,
        Command::Idem(command) => idem::run(&client, command, out).await,
        Command::Cluster(ClusterCommand::Status { ranges: true }) => Ok(output::status(
            &status(&client, &global.endpoints).await,
            out,
        )),
        Command::Cluster(ClusterCommand::Status { ranges: false }) => {
            let members = client.members().await?;
            Ok(output::cluster::members(&members, out))
        }
        Command::Cluster(ClusterCommand::AddNode { node_id, addr }) => {
            let nodes = client.add_node(node_id, &addr).await?;
            Ok(output::cluster::added(node_id, &nodes, out))
        }
        Command::Cluster(ClusterCommand::RemoveNode {
            node_id,
            no_wait,
            wait_secs,
        }) => {
            client.remove_node(node_id).await?;
            if no_wait {
                return Ok(output::cluster::draining(node_id, out));
            }
            let wait = Duration::from_secs(wait_secs);
            drain(&client, node_id, wait, out).await
        }
        Command::Cluster(ClusterCommand::TransferLeader { range, node }) => {
            client.transfer_leader(RangeId(range), node).await?;
            Ok(output::cluster::transferred(range, node, out))
        }
        Command::Cluster(ClusterCommand::Ranges) => {
            let ranges = client.ranges().await?;
            Ok(output::cluster::ranges(&ranges, out))
        }
        Command::Cluster(ClusterCommand::Check { range, wait_secs }) => {
            let wait = Duration::from_secs(wait_secs);
            let checked = client.check(range.map(RangeId), wait).await?;
            Ok(output::cluster::checked(&checked, out))
        }
        Command::Cluster(ClusterCommand::Split { at }) => {
            let (left, right) = client.split(&bytes(&at)).await?;
            Ok(output::cluster::split(&left, &right, out))
        }
        Command::Backup { out: file } => {
            let backup = backup::run(&client, &file).await?;
            Ok(output::backup::backed_up(&backup, out))
        }
        Command::Serve(_) | Command::Dev(_) | Command::Restore(_) => {
            unreachable!("main runs serve, dev and restore; only client commands come here")
        }
    }
}

/// Waits until `node` is drained (marked removed), printing its progress to stderr when it
/// changes; exit 3 when `wait` runs out first.
async fn drain(
    client: &Client,
    node: NodeId,
    wait: Duration,
    out: Output,
) -> Result<Report, KvError> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut last = None;
    loop {
        let members = client.members().await?;
        let entry = members.nodes.iter().find(|entry| entry.node_id == node);
        let left = entry.map(|entry| (entry.state.clone(), entry.replicas, entry.leaders));
        match &left {
            None => return Ok(output::cluster::removed(node, out)),
            Some((state, _, _)) if state == "removed" => {
                return Ok(output::cluster::removed(node, out));
            }
            Some((state, replicas, leaders)) if last.as_ref() != left.as_ref() => {
                eprintln!("node {node} {state}: {replicas} replicas, {leaders} leaders left");
            }
            Some(_) => {}
        }
        last = left;
        if tokio::time::Instant::now() >= deadline {
            return Err(KvError::Timeout {
                message: format!(
                    "node {node} is not drained after {wait:?}; the drain goes on (`keel cluster status` shows it)"
                ),
            });
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// How often `cluster remove-node` looks at the drain.
const DRAIN_POLL: Duration = Duration::from_secs(1);

/// Prints pages of `[start, end)` as they arrive, until `limit` rows or the end.
/// `keel history`: pages of the key's events from `from` until `limit` events or the end.
/// The first key after every key that starts with `prefix` (empty: the end of the
/// keyspace, for an empty prefix or one of 0xff bytes only).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    end
}

/// Prints the watch's events as they come, until `count` of them (or forever).
async fn watch(
    client: &Client,
    (start, end): (&[u8], &[u8]),
    options: WatchOptions,
    count: Option<u64>,
    out: Output,
) -> Result<Report, KvError> {
    let prev_kv = options.prev_kv;
    let mut watch = client.watch(start, end, options).await?;
    let mut left = count.unwrap_or(u64::MAX);
    // Ctrl-C ends the watch cleanly: every line taken so far was written and flushed.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let batch = tokio::select! {
            batch = watch.next() => batch,
            _ = &mut interrupted => None,
        };
        let Some(batch) = batch else { break };
        let mut events = batch?.events;
        events.truncate(usize::try_from(left).unwrap_or(usize::MAX));
        left -= events.len() as u64;
        let mut stdout = std::io::stdout().lock();
        let written = stdout.write_all(&output::watch_rows(&events, out, prev_kv));
        if written.and_then(|()| stdout.flush()).is_err() || left == 0 {
            break;
        }
    }
    Ok(Report::default())
}

async fn history(
    client: &Client,
    key: &[u8],
    mut from: u64,
    limit: u32,
    (consistency, bound): (Consistency, ReadBound),
    out: Output,
) -> Result<Report, KvError> {
    let mut remaining = limit;
    let mut stdout = std::io::stdout().lock();
    loop {
        let page_limit = remaining.min(limits::HISTORY_LIMIT_MAX);
        let page = client
            .history(key, from, page_limit, consistency, bound)
            .await?;
        remaining = remaining.saturating_sub(page.events.len() as u32);
        if stdout
            .write_all(&output::history_rows(&page.events, out))
            .is_err()
            || !page.more
        {
            return Ok(Report::default());
        }
        if page.next_revision <= from {
            return Err(KvError::fatal(format!(
                "history made no progress: next page starts at revision {}, not after {from}",
                page.next_revision
            )));
        }
        if remaining == 0 {
            let stderr = format!(
                "more events follow revision {}; raise --limit or use --from {} to see them",
                page.next_revision - 1,
                page.next_revision
            );
            return Ok(Report {
                stderr,
                code: code::OK,
                stdout: Vec::new(),
            });
        }
        from = page.next_revision;
    }
}

async fn scan(
    client: &Client,
    (mut start, end): (Vec<u8>, Vec<u8>),
    limit: u32,
    (consistency, bound, at): (Consistency, ReadBound, Option<Revision>),
    out: Output,
) -> Result<Report, KvError> {
    let mut remaining = limit;
    let mut stdout = std::io::stdout().lock();
    loop {
        let page_limit = remaining.min(limits::SCAN_LIMIT_MAX);
        let page = match at {
            Some(revision) => {
                client
                    .scan_at(&start, &end, page_limit, revision, consistency)
                    .await?
            }
            None => {
                client
                    .scan_within(&start, &end, page_limit, consistency, bound)
                    .await?
            }
        };
        remaining = remaining.saturating_sub(page.kvs.len() as u32);
        if stdout
            .write_all(&output::scan_rows(&page.kvs, out))
            .is_err()
        {
            return Ok(Report::default());
        }
        let Some(next) = page.next_start else {
            return Ok(Report::default());
        };
        if next <= start {
            return Err(KvError::fatal(format!(
                "scan made no progress: next page starts at {}, not after {}",
                validate::show_key(&next),
                validate::show_key(&start)
            )));
        }
        if remaining == 0 {
            let last = page.kvs.last().map_or(&next, |kv| &kv.key);
            let stderr = format!(
                "more keys follow {}; raise --limit to see them",
                validate::show_key(last)
            );
            return Ok(Report {
                stderr,
                code: code::OK,
                stdout: Vec::new(),
            });
        }
        start = next;
    }
}

/// Asks every endpoint at once; one row per endpoint, in the order given.
async fn status(client: &Client, endpoints: &[String]) -> Vec<StatusRow> {
    let mut tasks = tokio::task::JoinSet::new();
    for (index, endpoint) in endpoints.iter().enumerate() {
        let client = client.clone();
        let endpoint = endpoint.clone();
        tasks.spawn(async move {
            let answer = client.status(&endpoint).await;
            (index, (endpoint, answer))
        });
    }
    let mut rows: Vec<(usize, StatusRow)> = tasks.join_all().await.into_iter().collect();
    rows.sort_by_key(|(index, _)| *index);
    rows.into_iter().map(|(_, row)| row).collect()
}
