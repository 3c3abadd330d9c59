//! The `sessions` table: each range's client sessions (`Session`), keyed by range id then
//! client id; part of a range's exactly-once state, whose rules are `session`'s. A session's
//! `records` counts its rows in `requests`; `sm_meta` counts the range's sessions.

use keel_types::RangeId;
use redb::{ReadableTable, Table, TableDefinition};
use serde::{Deserialize, Serialize};

use super::Bytes;
use crate::codec::{Digest, decode_body, encode, split_version};
use crate::error::StorageError;

pub(crate) const SESSIONS: TableDefinition<Bytes, Bytes> = TableDefinition::new("sessions");

/// Key of a client session: range id then client id.
pub(crate) fn session_key(range: RangeId, client_id: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&range.0.to_be_bytes());
    key[8..].copy_from_slice(&client_id.to_be_bytes());
    key
}

/// The client id of a `sessions` key.
pub(crate) fn session_key_client(key: &[u8]) -> u64 {
    let client: [u8; 8] = key[8..16].try_into().expect("sessions keys are 16 bytes");
    u64::from_be_bytes(client)
}

/// One client session of a range (`session` decides with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Session {
    /// Whose requests it answers (`session::owner_of`); `None` in a session written before
    /// format 6, which the next request's owner takes.
    pub owner: Option<Digest>,
    /// `RequestId::client_started_ms` of the client.
    pub started_ms: u64,
    /// Range clock of the newest request of this session.
    pub last_active_ms: u64,
    /// Requests below this sequence have no record and are refused.
    pub completed_below: u64,
    /// Rows of this session in `requests`.
    pub records: u64,
}

impl Session {
    /// Decodes a session of any readable format.
    pub fn decode(bytes: &[u8]) -> Result<Session, StorageError> {
        let (version, body) = split_version("session", bytes)?;
        if version >= 6 {
            return decode_body("session", body);
        }
        Ok(decode_body::<SessionV1>("session", body)?.into())
    }
}

impl From<SessionV1> for Session {
    fn from(old: SessionV1) -> Session {
        Session {
            owner: None,
            started_ms: old.started_ms,
            last_active_ms: old.last_active_ms,
            completed_below: old.completed_below,
            records: old.records,
        }
    }
}

/// A session as formats 2 to 5 stored it: without an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SessionV1 {
    pub started_ms: u64,
    pub last_active_ms: u64,
    pub completed_below: u64,
    pub records: u64,
}

/// A range's session of `client_id`, if it has one.
pub(crate) fn read_session<R>(
    sessions: &R,
    range: RangeId,
    client_id: u64,
) -> Result<Option<Session>, StorageError>
where
    R: ReadableTable<Bytes, Bytes>,
{
    let key = session_key(range, client_id);
    let row = sessions
        .get(key.as_slice())
        .map_err(|e| StorageError::redb("read session", e))?;
    row.map(|value| Session::decode(value.value())).transpose()
}

pub(crate) fn write_session(
    sessions: &mut Table<Bytes, Bytes>,
    range: RangeId,
    client_id: u64,
    session: &Session,
) -> Result<(), StorageError> {
    let key = session_key(range, client_id);
    sessions
        .insert(key.as_slice(), encode(session).as_slice())
        .map_err(|e| StorageError::redb("write session", e))?;
    Ok(())
}
