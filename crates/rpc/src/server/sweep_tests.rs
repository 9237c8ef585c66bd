//! The connection sweep (`sweep`) against real TLS on 127.0.0.1: connections whose
//! certificate stops verifying are closed, calls in flight get their answers first.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use proto::api;

use super::tests::{
    Slow, WAIT, bind, channel_with_socket, closed_within, server_credentials, small,
};
use super::*;
use crate::tls::{Anchors, Authenticator, Credentials, server_config};

/// A node certificate of `ca` for a fresh key, as client credentials.
fn node_credentials(ca: &pki::Ca) -> Credentials {
    let key = identity::NodeKey::generate().unwrap();
    let template = pki::Template {
        common_name: key.node_id(),
        dns_names: vec![key.node_id()],
        ip_addresses: vec!["127.0.0.1".parse().unwrap()],
        usage: pki::Usage::ServerAndClient,
        lifetime: Duration::from_secs(3600),
        kind: pki::CertificateKind::Node,
    };
    Credentials {
        certificate: ca.issue(&template, &key.public_key()).unwrap().der,
        key_pkcs8: key.pkcs8_der().to_vec(),
    }
}

/// An old and a new CA (a rotation's two).
fn two_cas() -> (pki::Ca, pki::Ca) {
    (
        pki::Ca::generate("old CA", pki::CA_LIFETIME).unwrap(),
        pki::Ca::generate("new CA", pki::CA_LIFETIME).unwrap(),
    )
}

/// Anchors trusting `cas`, each with an empty CRL.
fn trusting(cas: &[&pki::Ca]) -> Anchors {
    Anchors {
        cas: cas.iter().map(|c| c.cert_der.clone()).collect(),
        crls: cas.iter().map(|c| c.crl(&[], 1).unwrap()).collect(),
    }
}

/// A curator-like server on 127.0.0.1 whose calls take `delay`, checking callers against
/// anchors the test replaces (the returned slot), `initial` at first.
async fn serve_switchable(
    initial: Anchors,
    delay: Duration,
) -> (SocketAddr, Arc<std::sync::Mutex<Anchors>>) {
    let (listener, address) = bind().await;
    let anchors = Arc::new(std::sync::Mutex::new(initial));
    let source = anchors.clone();
    let trust: TrustSource = Arc::new(move || {
        let anchors = source.lock().unwrap().clone();
        Box::pin(async move { Ok(anchors) })
    });
    let limits = Limits {
        idle_timeout: Duration::from_secs(60),
        first_call_timeout: Duration::from_secs(60),
        ..small(16, 16)
    };
    tokio::spawn(
        builder()
            .layer(AuthLayer::new(Arc::new(Authenticator::new()), trust))
            .add_service(api::curator_local_server::CuratorLocalServer::new(Slow {
                delay,
            }))
            .serve_with_incoming(incoming_with(
                listener,
                server_config(&server_credentials()).unwrap(),
                limits,
            )),
    );
    (address, anchors)
}

#[tokio::test]
async fn a_connection_is_closed_once_its_certificate_no_longer_verifies() {
    let (old, new) = two_cas();
    let (address, anchors) = serve_switchable(trusting(&[&old, &new]), Duration::ZERO).await;
    let call = async |channel: &tonic::transport::Channel| {
        api::curator_local_client::CuratorLocalClient::new(channel.clone())
            .get_current_leader(api::GetCurrentLeaderRequest {})
            .await
            .map(|_| ())
    };
    let (of_old, old_socket) = channel_with_socket(address, Some(&node_credentials(&old))).await;
    let new_credentials = node_credentials(&new);
    let (of_new, new_socket) = channel_with_socket(address, Some(&new_credentials)).await;
    let (stranger, stranger_socket) =
        channel_with_socket(address, Some(&server_credentials())).await;
    for channel in [&of_old, &of_new, &stranger] {
        call(channel).await.expect("a call gets through");
    }
    // Nothing changed: every connection stays (the sweep looks every 2 s).
    assert!(!closed_within(&old_socket, Duration::from_secs(3)).await);

    // The old CA retired: its certificate's connection closes; the others stay.
    *anchors.lock().unwrap() = trusting(&[&new]);
    assert!(
        closed_within(&old_socket, WAIT).await,
        "the connection of a retired CA's certificate stayed open"
    );
    assert!(!closed_within(&new_socket, Duration::from_millis(100)).await);
    assert!(!closed_within(&stranger_socket, Duration::from_millis(100)).await);
    call(&of_new).await.expect("the new CA's connection serves");
    call(&stranger)
        .await
        .expect("a self-signed caller is not swept");

    // Its serial revoked (a removed operator, a deleted node): that one closes too.
    let serial = pki::certificate_serial(&new_credentials.certificate).unwrap();
    *anchors.lock().unwrap() = Anchors {
        cas: vec![new.cert_der.clone()],
        crls: vec![new.crl(&[serial], 2).unwrap()],
    };
    assert!(
        closed_within(&new_socket, WAIT).await,
        "the connection of a revoked certificate stayed open"
    );
    assert!(!closed_within(&stranger_socket, Duration::from_millis(100)).await);
}

#[tokio::test]
async fn a_call_in_flight_ends_with_its_answer_before_its_connection_is_closed() {
    let (old, new) = two_cas();
    let (address, anchors) =
        serve_switchable(trusting(&[&old, &new]), Duration::from_secs(3)).await;
    let (channel, socket) = channel_with_socket(address, Some(&node_credentials(&old))).await;
    // Kept open by the test (a dropped channel leaves unread bytes that hide the close).
    let calling = channel.clone();
    let call = tokio::spawn(async move {
        api::curator_local_client::CuratorLocalClient::new(calling)
            .get_current_leader(api::GetCurrentLeaderRequest {})
            .await
            .map(|_| ())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The CA retired while the call runs: the call still gets its answer…
    *anchors.lock().unwrap() = trusting(&[&new]);
    call.await
        .unwrap()
        .expect("a call under way ends with its own answer");
    // …and the connection is closed after the grace.
    assert!(
        closed_within(&socket, Duration::from_secs(40)).await,
        "the connection of a retired CA's certificate stayed open"
    );
    drop(channel);
}
