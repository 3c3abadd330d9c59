//! Lock wait queues on a range's leader: the decisions of one queue without I/O (`queue`),
//! the registry of running queues and the channels into them (`registry`), the task that
//! drives one queue (`driver`), and the entry the Lock service waits and releases through
//! (`queues`). Proposes through `requests::coordinated`; never imports `api`.

pub(crate) mod driver;
pub(crate) mod queue;
pub(crate) mod queues;
pub(crate) mod registry;
