use super::*;

fn digest(hash: u8, buckets: &[(usize, u8)]) -> RangeDigest {
    let mut all = vec![[0; 32]; limits::CHECK_BUCKETS];
    for (bucket, fill) in buckets {
        all[*bucket] = [*fill; 32];
    }
    RangeDigest {
        format: 10,
        hash: [hash; 32],
        facts: [0; 32],
        buckets: all,
        rows: 0,
        bytes: 0,
        located: Vec::new(),
        located_cut: false,
    }
}

fn answers(list: Vec<(NodeId, ReplicaAnswer)>) -> BTreeMap<NodeId, ReplicaAnswer> {
    list.into_iter().collect()
}

#[test]
fn equal_hashes_are_consistent() {
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(7, &[]))),
        (3, ReplicaAnswer::Digest(digest(7, &[]))),
    ]);
    let (verdict, divergent, majority) = judge(&a);
    assert_eq!(verdict, Verdict::Consistent);
    assert!(divergent.is_empty());
    assert_eq!(majority.unwrap().hash, [7; 32]);
}

#[test]
fn the_odd_one_out_is_named() {
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(8, &[]))),
        (3, ReplicaAnswer::Digest(digest(7, &[]))),
    ]);
    let (verdict, divergent, _) = judge(&a);
    assert_eq!(verdict, Verdict::Divergent);
    assert_eq!(divergent, vec![2]);
    assert!(verdict.is_alarm());
}

#[test]
fn an_unreadable_replica_differs() {
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(7, &[]))),
        (3, ReplicaAnswer::Unreadable("bad row".into())),
    ]);
    assert_eq!(judge(&a).0, Verdict::Divergent);
    assert_eq!(judge(&a).1, vec![3]);
}

#[test]
fn a_missing_answer_is_neither_for_nor_against() {
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(7, &[]))),
        (3, ReplicaAnswer::NoDigest("timed out".into())),
    ]);
    assert_eq!(judge(&a).0, Verdict::Unconfirmed);
    assert!(judge(&a).1.is_empty());
}

#[test]
fn no_majority_names_nobody() {
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(8, &[]))),
        (3, ReplicaAnswer::NoDigest("timed out".into())),
    ]);
    let (verdict, divergent, majority) = judge(&a);
    assert_eq!(verdict, Verdict::NoMajority);
    assert!(divergent.is_empty());
    assert!(majority.is_none());
    // Two against one without an answer from a fourth voter is still no majority of four.
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(7, &[]))),
        (3, ReplicaAnswer::Digest(digest(8, &[]))),
        (4, ReplicaAnswer::NoDigest("timed out".into())),
    ]);
    assert_eq!(judge(&a).0, Verdict::NoMajority);
}

#[test]
fn another_format_is_not_compared() {
    let mut other = digest(9, &[]);
    other.format = 11;
    let a = answers(vec![
        (1, ReplicaAnswer::Digest(digest(7, &[]))),
        (2, ReplicaAnswer::Digest(digest(7, &[]))),
        (3, ReplicaAnswer::Digest(other)),
    ]);
    assert_eq!(judge(&a).0, Verdict::Unconfirmed);
    assert!(judge(&a).1.is_empty());
}

#[test]
fn buckets_and_rows_that_differ_are_found() {
    let majority = digest(7, &[(3, 1), (900, 2)]);
    let mut other = digest(8, &[(3, 1), (900, 5), (17, 4)]);
    assert_eq!(divergent_buckets(&majority, &other), vec![17, 900]);
    let mut majority = majority;
    majority.located = vec![
        (CheckedRow::Key(b"a".to_vec()), [1; 32]),
        (CheckedRow::Key(b"b".to_vec()), [2; 32]),
        (CheckedRow::Lock(b"l".to_vec()), [3; 32]),
    ];
    other.located = vec![
        (CheckedRow::Key(b"a".to_vec()), [1; 32]),
        (CheckedRow::Key(b"b".to_vec()), [9; 32]),
        (CheckedRow::Key(b"c".to_vec()), [4; 32]),
    ];
    assert_eq!(
        divergent_rows(&majority, &other),
        vec![
            CheckedRow::Key(b"b".to_vec()),
            CheckedRow::Key(b"c".to_vec()),
            CheckedRow::Lock(b"l".to_vec()),
        ]
    );
    // A side cut short may hold `c` and `l` past its cut: only the row both list differs.
    other.located_cut = true;
    assert_eq!(
        divergent_rows(&majority, &other),
        vec![CheckedRow::Key(b"b".to_vec())]
    );
}

#[test]
fn buckets_are_fixed_and_shared_by_a_keys_rows() {
    // Fixed for every release: a change would make replicas of two releases disagree.
    assert_eq!(
        CheckedRow::Key(b"a".to_vec()).bucket(),
        (0xaf63_dc4c_8601_ec8c_u64 % 1024) as u16
    );
    let key = CheckedRow::Key(b"user/42".to_vec()).bucket();
    assert_eq!(CheckedRow::Fence(b"user/42".to_vec()).bucket(), key);
    let session = CheckedRow::Session { client_id: 9 }.bucket();
    let request = CheckedRow::Request {
        client_id: 9,
        sequence: 3,
    }
    .bucket();
    assert_eq!(session, request);
    assert!(usize::from(key) < limits::CHECK_BUCKETS);
}
