//! Ranges on this node: routing a key to the group that serves it and keeping the range
//! tables fresh (`lookup`, `watch`), reaching the meta range (`meta`), splits by size and
//! load (`split`, `split_driver`), publishing descriptors to the meta range (`publisher`),
//! adding, moving and removing replicas (`replicas`), the cleanup of expired state
//! (`cleanup`) and the compaction of each replica's history (`compaction`), both rounds per
//! range that fall due (`rounds`). Uses `shared` and `peer`; never imports `cluster`, `requests`, `locks` or
//! `api`.

pub(crate) mod check;
pub(crate) mod cleanup;
pub(crate) mod compaction;
pub(crate) mod lookup;
pub(crate) mod meta;
pub(crate) mod publisher;
pub(crate) mod replicas;
pub(crate) mod rounds;
pub(crate) mod split;
pub(crate) mod split_driver;
pub(crate) mod watch;
