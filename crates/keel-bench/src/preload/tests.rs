//! Preload chunking and endpoint rotation.

use super::*;

#[test]
fn chunks_cover_the_keyspace_within_limits() {
    let check = |keyspace: usize, value_bytes: usize, size: usize| {
        let chunks = chunks(keyspace, value_bytes);
        assert_eq!(chunks.first().map(|chunk| chunk.start), Some(0));
        assert_eq!(chunks.last().map(|chunk| chunk.end), Some(keyspace));
        assert!(chunks.windows(2).all(|pair| pair[0].end == pair[1].start));
        assert!(
            chunks
                .iter()
                .all(|chunk| !chunk.is_empty() && chunk.len() <= size)
        );
        assert_eq!(chunks[0].len(), size.min(keyspace));
    };
    check(10_000, 256, limits::PRELOAD_OPS_MAX);
    check(1, 256, limits::PRELOAD_OPS_MAX);
    check(1_000, 64 * 1024, 15);
    check(3, 1024 * 1024, 1);
}

#[test]
fn rotation_starts_at_each_endpoint() {
    let endpoints: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
    assert_eq!(rotate(&endpoints, 0), ["a", "b", "c"]);
    assert_eq!(rotate(&endpoints, 1), ["b", "c", "a"]);
    assert_eq!(rotate(&endpoints, 5), ["c", "a", "b"]);
}

#[tokio::test]
async fn a_failed_chunk_fails_the_preload() {
    let result = run(chunks(1_000, 256), |chunk| async move {
        match chunk.start {
            0 => Ok(()),
            _ => Err("refused".to_string()),
        }
    })
    .await;
    let message = format!("{:#}", result.unwrap_err());
    assert!(
        message.contains("refused") && message.contains("keys 128..256"),
        "{message}"
    );
}

#[tokio::test]
async fn every_chunk_is_written_once() {
    let written = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = written.clone();
    run(chunks(1_000, 256), move |chunk| {
        let sink = sink.clone();
        async move {
            sink.lock().unwrap().extend(chunk);
            Ok(())
        }
    })
    .await
    .unwrap();
    let mut written = written.lock().unwrap().clone();
    written.sort_unstable();
    assert_eq!(written, (0..1_000).collect::<Vec<_>>());
}
