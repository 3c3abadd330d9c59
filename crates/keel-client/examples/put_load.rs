//! A first put benchmark: `CLIENTS` tasks each write 256-byte values to their own keys in a
//! closed loop for `SECONDS`, then latency percentiles and throughput are printed. Bounded in
//! time and in operations. The full load generator is `keel-bench`'s job; this one exists to
//! give the core its first figures.
//!
//! cargo run --release -p keel-client --example put_load -- ENDPOINTS CLIENTS SECONDS

use std::time::{Duration, Instant};

use keel_client::{Client, ClientOptions, PutOptions};

const VALUE_BYTES: usize = 256;
const KEYSPACE: usize = 10_000;
/// Most operations one task records, whatever the duration.
const OPS_PER_CLIENT_MAX: usize = 1_000_000;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let endpoints = args
        .first()
        .map_or("127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003", |s| s);
    let clients: usize = args.get(1).map_or(1, |s| s.parse().expect("CLIENTS"));
    let seconds: u64 = args.get(2).map_or(10, |s| s.parse().expect("SECONDS"));
    let endpoints = endpoints.split(',').map(str::to_string).collect();
    let client = Client::new(endpoints, ClientOptions::default()).expect("endpoints");
    let value = vec![b'v'; VALUE_BYTES];
    client
        .put(b"warm-up", &value, PutOptions::default())
        .await
        .expect("warm-up put");

    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for task in 0..clients {
        let (client, value) = (client.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let (mut latencies, mut errors) = (Vec::new(), 0usize);
            while Instant::now() < deadline && latencies.len() < OPS_PER_CLIENT_MAX {
                let key = format!("load-{}", (task * 7919 + latencies.len()) % KEYSPACE);
                let start = Instant::now();
                match client
                    .put(key.as_bytes(), &value, PutOptions::default())
                    .await
                {
                    Ok(_) => latencies.push(start.elapsed()),
                    Err(_) => errors += 1,
                }
            }
            (latencies, errors)
        }));
    }
    let started = Instant::now();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for task in tasks {
        let (mut task_latencies, task_errors) = task.await.expect("load task");
        latencies.append(&mut task_latencies);
        errors += task_errors;
    }
    let elapsed = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let percentile = |p: f64| {
        let index = ((latencies.len() as f64 * p) as usize).min(latencies.len().saturating_sub(1));
        latencies.get(index).map_or(0, |d| d.as_micros())
    };
    println!(
        "clients={clients} ops={} errors={errors} ops_per_sec={:.0} p50_us={} p99_us={} p999_us={}",
        latencies.len(),
        latencies.len() as f64 / elapsed,
        percentile(0.50),
        percentile(0.99),
        percentile(0.999),
    );
}
