//! The encoding of openraft messages between nodes: one format-version byte, then postcard.
//! Knows nothing of the transport that carries the bytes.

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// Version of the encoding of Raft messages. Bump it when a message layout changes.
pub const FORMAT_VERSION: u8 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    #[error("raft message is empty")]
    Empty,
    #[error("raft message has format version {found}; this node speaks version {FORMAT_VERSION}")]
    Version { found: u8 },
    #[error("raft message does not decode: {0}")]
    Decode(String),
    #[error("raft message does not encode: {0}")]
    Encode(String),
}

pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, WireError> {
    postcard::to_extend(value, vec![FORMAT_VERSION]).map_err(|e| WireError::Encode(e.to_string()))
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, WireError> {
    let (&version, body) = bytes.split_first().ok_or(WireError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(WireError::Version { found: version });
    }
    postcard::from_bytes(body).map_err(|e| WireError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_other_versions() {
        let bytes = encode(&(7u64, "x".to_string())).unwrap();
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<(u64, String)>(&bytes), Ok((7, "x".to_string())));
        let mut other = bytes.clone();
        other[0] = FORMAT_VERSION + 1;
        assert_eq!(
            decode::<(u64, String)>(&other),
            Err(WireError::Version {
                found: FORMAT_VERSION + 1
            })
        );
        assert_eq!(decode::<u64>(&[]), Err(WireError::Empty));
        assert!(matches!(
            decode::<(u64, String)>(&bytes[..2]),
            Err(WireError::Decode(_))
        ));
    }
}
