//! The key space the apiserver may use in etcd, and the rewriting that keeps it there
//! (pure): every key and range of a request is moved under [`PREFIX`], every key of an
//! answer is moved back, and a key an answer holds from outside the prefix is dropped
//! rather than shown. A range that names "every key from here on" (`range_end` = `\0`)
//! ends at the prefix's own end, so no request can reach past it.
//!
//! ```text
//!   apiserver key "/registry/pods/a"  ──▶  etcd "/polis-k8s/registry/pods/a"
//!   range ["/registry/", "\0")        ──▶  ["/polis-k8s/registry/", "/polis-k8t")
//! ```

use etcd_client::proto::{
    PbCompare, PbDeleteRequest, PbDeleteResponse, PbEvent, PbKeyValue, PbPutRequest, PbPutResponse,
    PbRangeRequest, PbRangeResponse, PbResponseOp, PbTxnOpRequest, PbTxnOpResponse, PbTxnRequest,
    PbTxnRequestOp, PbTxnResponse,
};

/// Where the apiserver's keys live in the cluster's etcd. Polis's own keys (the CA keys
/// among them) are outside it.
pub const PREFIX: &[u8] = b"/polis-k8s";

/// The first key after every key that starts with `prefix` (etcd's prefix range end);
/// `\0` (every key) when there is none.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `key` under the prefix.
pub fn key_in(key: &[u8]) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(key);
    k
}

/// A request's `[key, range_end)` under the prefix: a single key stays a single key,
/// "from `key` on" (`\0`) ends at the prefix's end.
pub fn range_in(key: &[u8], range_end: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let end = match range_end {
        [] => Vec::new(),
        [0] => prefix_end(PREFIX),
        end => key_in(end),
    };
    (key_in(key), end)
}

/// `key` with the prefix taken off; `None` for a key outside it (never shown).
pub fn key_out(key: &[u8]) -> Option<Vec<u8>> {
    key.strip_prefix(PREFIX).map(<[u8]>::to_vec)
}

fn kv_out(mut kv: PbKeyValue) -> Option<PbKeyValue> {
    kv.key = key_out(&kv.key)?;
    Some(kv)
}

fn kvs_out(kvs: Vec<PbKeyValue>) -> Vec<PbKeyValue> {
    kvs.into_iter().filter_map(kv_out).collect()
}

pub fn range_request(mut r: PbRangeRequest) -> PbRangeRequest {
    (r.key, r.range_end) = range_in(&r.key, &r.range_end);
    r
}

pub fn range_response(mut r: PbRangeResponse) -> PbRangeResponse {
    r.kvs = kvs_out(r.kvs);
    r
}

pub fn put_request(mut r: PbPutRequest) -> PbPutRequest {
    r.key = key_in(&r.key);
    r
}

pub fn put_response(mut r: PbPutResponse) -> PbPutResponse {
    r.prev_kv = r.prev_kv.and_then(kv_out);
    r
}

pub fn delete_request(mut r: PbDeleteRequest) -> PbDeleteRequest {
    (r.key, r.range_end) = range_in(&r.key, &r.range_end);
    r
}

pub fn delete_response(mut r: PbDeleteResponse) -> PbDeleteResponse {
    r.prev_kvs = kvs_out(r.prev_kvs);
    r
}

fn compare(mut c: PbCompare) -> PbCompare {
    (c.key, c.range_end) = range_in(&c.key, &c.range_end);
    c
}

fn op_request(mut op: PbTxnRequestOp) -> PbTxnRequestOp {
    op.request = op.request.map(|r| match r {
        PbTxnOpRequest::RequestRange(r) => PbTxnOpRequest::RequestRange(range_request(r)),
        PbTxnOpRequest::RequestPut(r) => PbTxnOpRequest::RequestPut(put_request(r)),
        PbTxnOpRequest::RequestDeleteRange(r) => {
            PbTxnOpRequest::RequestDeleteRange(delete_request(r))
        }
        PbTxnOpRequest::RequestTxn(r) => PbTxnOpRequest::RequestTxn(txn_request(r)),
    });
    op
}

pub fn txn_request(mut r: PbTxnRequest) -> PbTxnRequest {
    r.compare = r.compare.into_iter().map(compare).collect();
    r.success = r.success.into_iter().map(op_request).collect();
    r.failure = r.failure.into_iter().map(op_request).collect();
    r
}

fn op_response(mut op: PbResponseOp) -> PbResponseOp {
    op.response = op.response.map(|r| match r {
        PbTxnOpResponse::ResponseRange(r) => PbTxnOpResponse::ResponseRange(range_response(r)),
        PbTxnOpResponse::ResponsePut(r) => PbTxnOpResponse::ResponsePut(put_response(r)),
        PbTxnOpResponse::ResponseDeleteRange(r) => {
            PbTxnOpResponse::ResponseDeleteRange(delete_response(r))
        }
        PbTxnOpResponse::ResponseTxn(r) => PbTxnOpResponse::ResponseTxn(txn_response(r)),
    });
    op
}

pub fn txn_response(mut r: PbTxnResponse) -> PbTxnResponse {
    r.responses = r.responses.into_iter().map(op_response).collect();
    r
}

/// A watch event with its keys moved back; `None` when its key is outside the prefix.
pub fn event_out(mut e: PbEvent) -> Option<PbEvent> {
    e.kv = Some(kv_out(e.kv?)?);
    e.prev_kv = e.prev_kv.and_then(kv_out);
    Some(e)
}

/// Whether every key of `keys` (a lease's, as etcd lists them) is inside the prefix.
pub fn all_inside(keys: &[Vec<u8>]) -> bool {
    keys.iter().all(|k| k.starts_with(PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `key` lies in the etcd range `[start, end)` (`end` empty: `start` only;
    /// `\0`: every key from `start` on).
    fn in_range(key: &[u8], start: &[u8], end: &[u8]) -> bool {
        match end {
            [] => key == start,
            [0] => key >= start,
            end => key >= start && key < end,
        }
    }

    #[test]
    fn every_key_and_range_lands_inside_the_prefix() {
        assert_eq!(key_in(b"/registry/a"), b"/polis-k8s/registry/a");
        assert_eq!(prefix_end(PREFIX), b"/polis-k8t");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        let (k, e) = range_in(b"/registry/", b"\0");
        assert_eq!(
            (k.as_slice(), e.as_slice()),
            (&b"/polis-k8s/registry/"[..], &b"/polis-k8t"[..])
        );
        let (k, e) = range_in(b"", b"\0");
        assert_eq!((k.as_slice(), e.as_slice()), (PREFIX, &b"/polis-k8t"[..]));
        let (k, e) = range_in(b"a", b"");
        assert_eq!(
            (k.as_slice(), e.as_slice()),
            (&b"/polis-k8sa"[..], &b""[..])
        );
        // Polis's keys are never in a rewritten range.
        for (key, end) in [
            (&b""[..], &b"\0"[..]),
            (b"", b"\xff\xff\xff"),
            (b"\0", b"\0"),
            (b"/", b"0"),
            (b"\xff", b""),
        ] {
            let (k, e) = range_in(key, end);
            for polis in [
                &b"cluster/ca/key"[..],
                b"/cluster",
                b"namespaced:curator/x",
                b"/polis-k8t",
                b"\xff",
            ] {
                assert!(!in_range(polis, &k, &e), "{polis:?} in {k:?}..{e:?}");
            }
        }
    }

    #[test]
    fn answers_show_only_keys_from_inside_with_the_prefix_taken_off() {
        let inside = PbKeyValue {
            key: key_in(b"/registry/x"),
            ..Default::default()
        };
        let outside = PbKeyValue {
            key: b"cluster/ca".to_vec(),
            ..Default::default()
        };
        let r = range_response(PbRangeResponse {
            kvs: vec![inside.clone(), outside.clone()],
            ..Default::default()
        });
        assert_eq!(r.kvs.len(), 1);
        assert_eq!(r.kvs[0].key, b"/registry/x");
        assert!(
            event_out(PbEvent {
                kv: Some(outside),
                ..Default::default()
            })
            .is_none()
        );
        assert_eq!(
            event_out(PbEvent {
                kv: Some(inside),
                ..Default::default()
            })
            .and_then(|e| e.kv)
            .map(|kv| kv.key),
            Some(b"/registry/x".to_vec())
        );
    }

    #[test]
    fn nested_transactions_are_rewritten_all_the_way_down() {
        let inner = PbTxnRequest {
            compare: vec![PbCompare {
                key: b"/registry/a".to_vec(),
                ..Default::default()
            }],
            success: vec![PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestPut(PbPutRequest {
                    key: b"/registry/a".to_vec(),
                    ..Default::default()
                })),
            }],
            ..Default::default()
        };
        let outer = txn_request(PbTxnRequest {
            failure: vec![PbTxnRequestOp {
                request: Some(PbTxnOpRequest::RequestTxn(inner)),
            }],
            ..Default::default()
        });
        let Some(PbTxnOpRequest::RequestTxn(inner)) = &outer.failure[0].request else {
            panic!("{outer:?}")
        };
        assert_eq!(inner.compare[0].key, b"/polis-k8s/registry/a");
        let Some(PbTxnOpRequest::RequestPut(put)) = &inner.success[0].request else {
            panic!("{inner:?}")
        };
        assert_eq!(put.key, b"/polis-k8s/registry/a");
    }
}

/// Properties over arbitrary keys and ranges (proptest): no rewritten request can reach
/// a key outside the prefix.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn no_range_reaches_outside(
            key in prop::collection::vec(any::<u8>(), 0..8),
            end in prop::collection::vec(any::<u8>(), 0..8),
            outside in prop::collection::vec(any::<u8>(), 0..12),
        ) {
            prop_assume!(!outside.starts_with(PREFIX));
            let (k, e) = range_in(&key, &end);
            let reached = match e.as_slice() {
                [] => outside == k,
                [0] => outside >= k,
                e => outside >= k && outside.as_slice() < e,
            };
            prop_assert!(!reached, "{:?} reached by {:?}..{:?}", outside, k, e);
        }
    }
}
