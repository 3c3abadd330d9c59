//! Versioned encodings of everything persisted: one format-version byte, then a postcard
//! body. Knows nothing about tables, files or openraft's traits.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::StorageError;

/// The format version this build writes. Every version up to it must stay readable.
pub(crate) const FORMAT_VERSION: u8 = 1;

/// `FORMAT_VERSION` followed by the postcard encoding of `value`.
pub(crate) fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let bytes = vec![FORMAT_VERSION];
    postcard::to_extend(value, bytes).expect("postcard encoding into a Vec cannot fail")
}

/// Decodes a record written by `encode`; `what` names it in errors.
pub(crate) fn decode<T: DeserializeOwned>(
    what: &'static str,
    bytes: &[u8],
) -> Result<T, StorageError> {
    let body = body_of(what, bytes)?;
    let (value, rest) =
        postcard::take_from_bytes(body).map_err(|e| StorageError::corrupt(what, e))?;
    if !rest.is_empty() {
        return Err(StorageError::corrupt(
            what,
            format!("{} trailing bytes", rest.len()),
        ));
    }
    Ok(value)
}

/// `FORMAT_VERSION`, the postcard encoding of `header`, then `tail` verbatim. Used for user
/// values, so a value of a megabyte is not encoded byte by byte.
pub(crate) fn encode_with_tail<T: Serialize>(header: &T, tail: &[u8]) -> Vec<u8> {
    let mut bytes = encode(header);
    bytes.extend_from_slice(tail);
    bytes
}

/// Decodes a record written by `encode_with_tail`: the header and the raw tail.
pub(crate) fn decode_with_tail<'a, T: DeserializeOwned>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<(T, &'a [u8]), StorageError> {
    let body = body_of(what, bytes)?;
    postcard::take_from_bytes(body).map_err(|e| StorageError::corrupt(what, e))
}

fn body_of<'a>(what: &'static str, bytes: &'a [u8]) -> Result<&'a [u8], StorageError> {
    match bytes.split_first() {
        None => Err(StorageError::corrupt(what, "empty record")),
        Some((&version, body)) if version == FORMAT_VERSION => Ok(body),
        Some((&version, _)) => Err(StorageError::UnknownVersion {
            what,
            version,
            known: FORMAT_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_version_checks() {
        let bytes = encode(&(7u64, "seven".to_string()));
        assert_eq!(bytes[0], FORMAT_VERSION);
        let value: (u64, String) = decode("pair", &bytes).unwrap();
        assert_eq!(value, (7, "seven".to_string()));

        let mut future = bytes.clone();
        future[0] = FORMAT_VERSION + 1;
        let error = decode::<(u64, String)>("pair", &future).unwrap_err();
        assert!(
            matches!(error, StorageError::UnknownVersion { version: 2, .. }),
            "{error}"
        );

        assert!(matches!(
            decode::<u64>("empty", &[]),
            Err(StorageError::Corrupt { .. })
        ));
        let mut long = encode(&1u64);
        long.push(0);
        assert!(matches!(
            decode::<u64>("long", &long),
            Err(StorageError::Corrupt { .. })
        ));
    }

    #[test]
    fn tail_is_kept_verbatim() {
        let bytes = encode_with_tail(&(3u64, 4u64), b"value bytes");
        let (header, tail): ((u64, u64), &[u8]) = decode_with_tail("kv", &bytes).unwrap();
        assert_eq!(header, (3, 4));
        assert_eq!(tail, b"value bytes");
    }
}
