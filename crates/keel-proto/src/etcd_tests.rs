//! The vendored etcd protos keep etcd's wire format and method paths: bytes written by hand
//! from etcd's field numbers, and the service names etcd's clients call.

use prost::Message;

use crate::etcd::etcdserverpb::{PutRequest, RangeResponse, ResponseHeader};
use crate::etcd::mvccpb::KeyValue;
use crate::etcd::{etcdserverpb, v3electionpb, v3lockpb};

#[test]
fn a_put_request_encodes_with_etcds_field_numbers() {
    let put = PutRequest {
        key: b"k".to_vec(),
        value: b"v".to_vec(),
        lease: 7,
        prev_kv: true,
        ignore_value: true,
        ignore_lease: true,
    };
    // key 1, value 2 (length-delimited); lease 3, prev_kv 4, ignore_value 5, ignore_lease 6.
    let expected = [
        0x0a, 1, b'k', 0x12, 1, b'v', 0x18, 7, 0x20, 1, 0x28, 1, 0x30, 1,
    ];
    assert_eq!(put.encode_to_vec(), expected);
}

#[test]
fn a_range_response_decodes_from_etcds_bytes() {
    // KeyValue: key 1, create_revision 2, mod_revision 3, version 4, value 5, lease 6.
    let kv = [
        0x0a, 1, b'a', 0x10, 2, 0x18, 5, 0x20, 3, 0x2a, 1, b'x', 0x30, 9,
    ];
    // RangeResponse: header 1 (ResponseHeader.revision is field 3), kvs 2, more 3, count 4.
    let mut bytes = vec![0x0a, 2, 0x18, 5, 0x12, kv.len() as u8];
    bytes.extend_from_slice(&kv);
    bytes.extend_from_slice(&[0x18, 1, 0x20, 1]);
    let decoded = RangeResponse::decode(bytes.as_slice()).unwrap();
    let expected = RangeResponse {
        header: Some(ResponseHeader {
            revision: 5,
            ..ResponseHeader::default()
        }),
        kvs: vec![KeyValue {
            key: b"a".to_vec(),
            create_revision: 2,
            mod_revision: 5,
            version: 3,
            value: b"x".to_vec(),
            lease: 9,
        }],
        more: true,
        count: 1,
    };
    assert_eq!(decoded, expected);
}

#[test]
fn the_services_have_etcds_names() {
    let names = [
        etcdserverpb::kv_server::SERVICE_NAME,
        etcdserverpb::watch_server::SERVICE_NAME,
        etcdserverpb::lease_server::SERVICE_NAME,
        etcdserverpb::cluster_server::SERVICE_NAME,
        etcdserverpb::maintenance_server::SERVICE_NAME,
        etcdserverpb::auth_server::SERVICE_NAME,
        v3lockpb::lock_server::SERVICE_NAME,
        v3electionpb::election_server::SERVICE_NAME,
    ];
    let expected = [
        "etcdserverpb.KV",
        "etcdserverpb.Watch",
        "etcdserverpb.Lease",
        "etcdserverpb.Cluster",
        "etcdserverpb.Maintenance",
        "etcdserverpb.Auth",
        "v3lockpb.Lock",
        "v3electionpb.Election",
    ];
    assert_eq!(names, expected);
}
