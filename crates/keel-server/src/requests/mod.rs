//! A client request past the door: to the range that holds its key, here or one hop away on
//! that range's leader (`router`); its tenant's keys and bytes reserved on the leader before
//! it is proposed (`admission`); and lock and idempotency operations proposed and read back
//! (`coordinated`). Uses `ranges` and `access`; never imports `api`, `locks` or `cluster`.

pub(crate) mod admission;
pub(crate) mod coordinated;
pub(crate) mod router;
