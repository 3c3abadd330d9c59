//! The meta range through the real writer and redb: meta commands, the range-kind checks,
//! the reads of descriptors and nodes, and snapshots of the `meta` table.

use keel_types::{
    Command, CommandOutcome, MetaCommand, MetaOutcome, NodeAddr, NodeDescriptor, RangeDescriptor,
    RangeId, Rejection, Split,
};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};

use super::{apply_commands_to, mutate, open, put};
use crate::store::Store;

/// Applies commands to the meta range (or another) from log index 1 on.
struct Meta {
    store: Store,
    next: u64,
}

impl Meta {
    fn new(store: &Store) -> Meta {
        Meta {
            store: store.clone(),
            next: 1,
        }
    }

    async fn apply_to(&mut self, range: RangeId, command: Command) -> CommandOutcome {
        let outcomes = apply_commands_to(&self.store, range, self.next, vec![command]).await;
        self.next += 1;
        outcomes.into_iter().next().unwrap()
    }

    async fn apply(&mut self, command: MetaCommand) -> CommandOutcome {
        self.apply_to(RangeId::META, Command::Meta(command)).await
    }

    async fn allocate(&mut self, count: u64) -> RangeId {
        match self.apply(MetaCommand::AllocateRangeIds { count }).await {
            CommandOutcome::Meta(MetaOutcome::RangeIdsAllocated { first, count: got }) => {
                assert_eq!(got, count);
                first
            }
            other => panic!("expected an allocation, got {other:?}"),
        }
    }

    async fn ranges(&self) -> Vec<RangeDescriptor> {
        let sm = self.store.state_machine(RangeId::META);
        sm.meta_ranges().await.unwrap()
    }
}

fn descriptor(id: u64, start: &str, end: Option<&str>, epoch: u64) -> RangeDescriptor {
    RangeDescriptor {
        id: RangeId(id),
        start: start.as_bytes().to_vec(),
        end: end.map(|end| end.as_bytes().to_vec()),
        epoch,
        conf_version: 1,
        replicas: vec![1, 2, 3],
    }
}

fn node(id: u64, addr: &str) -> NodeDescriptor {
    NodeDescriptor {
        id,
        addr: NodeAddr::new(addr),
    }
}

fn update(ranges: Vec<RangeDescriptor>) -> MetaCommand {
    MetaCommand::UpdateRanges { ranges }
}

fn recorded(count: u32) -> CommandOutcome {
    CommandOutcome::Meta(MetaOutcome::RangesUpdated { recorded: count })
}

#[tokio::test]
async fn newer_descriptors_win_and_read_back_by_start_key() {
    let (_dir, store) = open();
    let mut meta = Meta::new(&store);
    let first = descriptor(1, "", None, 0);
    assert_eq!(meta.apply(update(vec![first.clone()])).await, recorded(1));
    let (left, right) = (descriptor(1, "", Some("m"), 1), descriptor(2, "m", None, 1));
    let both = update(vec![right.clone(), left.clone()]);
    assert_eq!(meta.apply(both).await, recorded(2));
    // A stale publisher's older descriptor is not recorded.
    assert_eq!(meta.apply(update(vec![first])).await, recorded(0));
    assert_eq!(meta.ranges().await, vec![left, right]);
    let sm = store.state_machine(RangeId::META);
    assert_eq!(
        sm.applied().await.unwrap().0,
        3,
        "one revision per applied command"
    );

    for (id, addr) in [(3, "c:1"), (1, "a:1"), (3, "c:2")] {
        let registered = meta.apply(MetaCommand::RegisterNode(node(id, addr))).await;
        assert_eq!(
            registered,
            CommandOutcome::Meta(MetaOutcome::NodeRegistered)
        );
    }
    let nodes = sm.meta_nodes().await.unwrap();
    assert_eq!(nodes, vec![node(1, "a:1"), node(3, "c:2")]);
    // Other ranges hold no meta rows.
    let data = store.state_machine(RangeId::FIRST);
    assert!(data.meta_ranges().await.unwrap().is_empty());
    assert!(data.meta_nodes().await.unwrap().is_empty());
}

#[tokio::test]
async fn allocated_range_ids_are_never_handed_out_again() {
    let (_dir, store) = open();
    let mut meta = Meta::new(&store);
    assert_eq!(meta.allocate(3).await, RangeId(2));
    assert_eq!(meta.allocate(1).await, RangeId(5));
    // A recorded descriptor moves the allocator past its id, an older id does not.
    meta.apply(update(vec![descriptor(10, "k", None, 1)])).await;
    assert_eq!(meta.allocate(2).await, RangeId(11));
    meta.apply(update(vec![descriptor(4, "a", Some("k"), 1)]))
        .await;
    assert_eq!(meta.allocate(1).await, RangeId(13));
    let refused = meta.apply(MetaCommand::AllocateRangeIds { count: 0 }).await;
    assert!(
        matches!(refused, CommandOutcome::Rejected(_)),
        "{refused:?}"
    );
    let too_many = keel_types::limits::RANGE_IDS_ALLOCATE_MAX + 1;
    let refused = meta
        .apply(MetaCommand::AllocateRangeIds { count: too_many })
        .await;
    assert!(
        matches!(refused, CommandOutcome::Rejected(_)),
        "{refused:?}"
    );
    assert_eq!(
        meta.allocate(1).await,
        RangeId(14),
        "a refusal hands out nothing"
    );
}

#[tokio::test]
async fn data_and_meta_commands_go_to_their_own_kind_of_range() {
    let (_dir, store) = open();
    let mut meta = Meta::new(&store);
    let wrong = |range| CommandOutcome::Rejected(Rejection::WrongRangeKind { range });
    let write = mutate(vec![put("k", "v", None)]);
    assert_eq!(
        meta.apply_to(RangeId::META, write.clone()).await,
        wrong(RangeId::META)
    );
    let split = Command::Split(Split {
        at: b"m".to_vec(),
        child: RangeId(2),
        expected_epoch: 0,
    });
    assert_eq!(
        meta.apply_to(RangeId::META, split).await,
        wrong(RangeId::META)
    );
    let register = Command::Meta(MetaCommand::RegisterNode(node(1, "a:1")));
    assert_eq!(
        meta.apply_to(RangeId::FIRST, register).await,
        wrong(RangeId::FIRST)
    );
    assert!(matches!(
        meta.apply_to(RangeId::FIRST, write).await,
        CommandOutcome::Applied { .. }
    ));
    let sm = store.state_machine(RangeId::META);
    assert!(sm.meta_nodes().await.unwrap().is_empty());
    assert_eq!(
        sm.get(b"k", 0).await.unwrap().0,
        None,
        "the meta range owns no key"
    );
    let descriptor = sm.descriptor().await.unwrap();
    assert_eq!((descriptor.start, descriptor.end), (vec![], Some(vec![])));
}

#[tokio::test]
async fn meta_rows_survive_a_snapshot_install() {
    let (_source_dir, source_store) = open();
    let mut source = Meta::new(&source_store);
    source
        .apply(update(vec![
            descriptor(1, "", Some("m"), 1),
            descriptor(7, "m", None, 1),
        ]))
        .await;
    source
        .apply(MetaCommand::RegisterNode(node(2, "b:1")))
        .await;
    source.allocate(4).await;
    let mut source_sm = source_store.state_machine(RangeId::META);
    let snapshot = source_sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    // The target's meta range records other things the install replaces.
    let (_dir, store) = open();
    let mut target = Meta::new(&store);
    target
        .apply(update(vec![descriptor(50, "z", None, 9)]))
        .await;
    target
        .apply(MetaCommand::RegisterNode(node(9, "z:1")))
        .await;
    target.allocate(100).await;
    let mut sm = store.state_machine(RangeId::META);
    sm.install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(sm.meta_ranges().await.unwrap(), source.ranges().await);
    assert_eq!(
        sm.meta_nodes().await.unwrap(),
        source_sm.meta_nodes().await.unwrap()
    );
    assert_eq!(
        sm.applied().await.unwrap(),
        source_sm.applied().await.unwrap()
    );
    assert_eq!(target.allocate(1).await, source.allocate(1).await);
    let descriptors = store.descriptors().await.unwrap();
    assert_eq!(descriptors.len(), 1);
    assert_eq!(descriptors[0].id, RangeId::META);
    assert_eq!(descriptors[0].end, Some(vec![]));
}
