//! Client classification and CRL-checked server trust, against real certificates and
//! real handshakes on 127.0.0.1.

use super::*;
use crate::authz::Identity;
use pki::{CertificateKind, Template, Usage};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use std::time::Duration;

/// A CA, its empty CRL, and an authenticator for it.
fn cluster() -> (pki::Ca, Vec<u8>, Authenticator) {
    let ca = pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME).unwrap();
    let crl = ca.crl(&[], 1).unwrap();
    let authenticator = Authenticator::new();
    (ca, crl, authenticator)
}

/// `ca` trusted alone, checked against `crl`.
fn only(ca: &pki::Ca, crl: &[u8]) -> Anchors {
    Anchors::one(ca.cert_der.clone(), Some(crl.to_vec()))
}

fn issue(ca: &pki::Ca, key: &[u8; 32], cn: &str, kind: CertificateKind) -> Vec<u8> {
    let template = Template {
        common_name: cn.into(),
        dns_names: vec![],
        ip_addresses: vec![],
        usage: Usage::ServerAndClient,
        lifetime: Duration::from_secs(3600),
        kind,
    };
    ca.issue(&template, key).unwrap().der
}

/// One TLS handshake with a server presenting `server` (at 127.0.0.1), as a client
/// trusting `trust`.
async fn handshake(server: &Credentials, trust: &ServerTrust) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(server).unwrap());
    let serving = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let _ = acceptor.accept(tcp).await;
    });
    let connector = tokio_rustls::TlsConnector::from(client_config(trust, None).unwrap());
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::IpAddress(address.ip().into());
    let outcome = connector
        .connect(name, tcp)
        .await
        .map(drop)
        .map_err(|e| e.to_string());
    serving.abort();
    outcome
}

/// A server certificate of `kind` for `key`, naming 127.0.0.1, and its serial.
fn serving(ca: &pki::Ca, key: &identity::NodeKey, kind: CertificateKind) -> (Credentials, Vec<u8>) {
    let issued = ca
        .issue(
            &Template {
                common_name: key.node_id(),
                dns_names: vec![key.node_id()],
                ip_addresses: vec![[127, 0, 0, 1].into()],
                usage: Usage::ServerAndClient,
                lifetime: Duration::from_secs(3600),
                kind,
            },
            &key.public_key(),
        )
        .unwrap();
    let credentials = Credentials {
        certificate: issued.der,
        key_pkcs8: key.pkcs8_der().to_vec(),
    };
    (credentials, issued.serial)
}

/// A node's own certificate, valid and unrevoked, does not make a curator: every
/// CA-checked trust refuses it and names why; a curator certificate passes.
#[tokio::test]
async fn a_node_certificate_is_not_a_curator() {
    let (ca, crl, _) = cluster();
    let key = identity::NodeKey::generate().unwrap();
    let slot = TrustSlot::new(ca.cert_der.clone());
    assert!(slot.offer(&crl).unwrap());
    let trusts = [
        ServerTrust::PinnedCa(ca.cert_der.clone()),
        ServerTrust::ClusterCa { trust: slot },
        ServerTrust::ClusterCa {
            trust: TrustSlot::new(ca.cert_der.clone()),
        },
    ];
    for trust in &trusts {
        for kind in [CertificateKind::Node, CertificateKind::Owner] {
            let (impostor, _) = serving(&ca, &key, kind);
            let refused = handshake(&impostor, trust).await.unwrap_err();
            assert!(
                refused.contains("not a curator certificate") && refused.contains(kind.mark()),
                "{trust:?}, {kind:?}: {refused}"
            );
        }
        let (curator, _) = serving(&ca, &key, CertificateKind::Curator);
        handshake(&curator, trust)
            .await
            .expect("a curator certificate");
    }
}

/// What a node serves about itself (its logs) is accepted only from that node's own
/// node certificate: another node's, or a curator certificate, is refused, saying why.
#[tokio::test]
async fn a_node_service_is_accepted_only_from_that_node() {
    let (ca, crl, _) = cluster();
    let key = identity::NodeKey::generate().unwrap();
    let other = identity::NodeKey::generate().unwrap();
    let slot = TrustSlot::new(ca.cert_der.clone());
    assert!(slot.offer(&crl).unwrap());
    let trust = ServerTrust::ClusterNode {
        trust: slot,
        node_id: key.node_id(),
    };
    let (own, _) = serving(&ca, &key, CertificateKind::Node);
    handshake(&own, &trust).await.expect("the node itself");
    let (another, _) = serving(&ca, &other, CertificateKind::Node);
    let refused = handshake(&another, &trust).await.unwrap_err();
    assert!(refused.contains(&other.node_id()), "{refused}");
    let (curator, _) = serving(&ca, &key, CertificateKind::Curator);
    let refused = handshake(&curator, &trust).await.unwrap_err();
    assert!(refused.contains("not a node certificate"), "{refused}");
}

/// A member answering about itself without a quorum: any node of the cluster, by its
/// node certificate (for the address dialed); a curator certificate is refused.
#[tokio::test]
async fn a_cluster_member_is_any_node_certificate() {
    let (ca, crl, _) = cluster();
    let key = identity::NodeKey::generate().unwrap();
    let slot = TrustSlot::new(ca.cert_der.clone());
    assert!(slot.offer(&crl).unwrap());
    let trust = ServerTrust::ClusterMember { trust: slot };
    let (node, _) = serving(&ca, &key, CertificateKind::Node);
    handshake(&node, &trust).await.expect("a node certificate");
    let (curator, _) = serving(&ca, &key, CertificateKind::Curator);
    let refused = handshake(&curator, &trust).await.unwrap_err();
    assert!(refused.contains("not a node certificate"), "{refused}");
}

#[tokio::test]
async fn a_revoked_server_is_refused_by_clients_holding_the_crl() {
    let (ca, empty_crl, _) = cluster();
    let key = identity::NodeKey::generate().unwrap();
    let (server, serial) = serving(&ca, &key, CertificateKind::Curator);
    let issued = pki::Issued {
        der: server.certificate.clone(),
        serial,
    };
    let revoking = ca.crl(std::slice::from_ref(&issued.serial), 2).unwrap();
    let slot = TrustSlot::new(ca.cert_der.clone());
    let trust = ServerTrust::ClusterCa {
        trust: slot.clone(),
    };
    handshake(&server, &trust).await.expect("no CRL yet");
    assert!(slot.offer(&empty_crl).unwrap());
    handshake(&server, &trust).await.expect("not revoked");
    assert!(slot.offer(&revoking).unwrap());
    let refused = handshake(&server, &trust).await.unwrap_err();
    assert!(refused.contains("Revoked"), "{refused}");
    // An older CRL does not undo the revocation; a CRL of another CA is refused.
    assert!(!slot.offer(&empty_crl).unwrap());
    assert!(handshake(&server, &trust).await.is_err());
    let foreign = pki::Ca::generate("Polis Cluster CA", pki::CA_LIFETIME).unwrap();
    let foreign_crl = foreign.crl(&[], 9).unwrap();
    assert!(slot.offer(&foreign_crl).is_err());
    // Without the CRL, the same server passes: it is the CRL that refuses it.
    let pinned = ServerTrust::PinnedCa(ca.cert_der.clone());
    handshake(&server, &pinned).await.expect("pinned CA only");
}

/// A certificate from the cluster CA with no role mark at all (as issued before
/// marks existed, or by a future issuer that forgot one).
fn unmarked(ca: &pki::Ca, key: &identity::NodeKey, cn: &str) -> Vec<u8> {
    let issuer_key = rcgen::KeyPair::try_from(ca.key_pkcs8()).unwrap();
    let issuer = rcgen::Issuer::from_ca_cert_der(&ca.cert_der.clone().into(), issuer_key).unwrap();
    let subject = rcgen::KeyPair::try_from(key.pkcs8_der()).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.signed_by(&subject, &issuer).unwrap().der().to_vec()
}

#[derive(Debug, PartialEq)]
enum Want {
    Anonymous,
    SelfSigned,
    Node,
    User(&'static str),
    Operator(pki::OperatorRole),
    Invalid,
}

fn kind_of(identity: &Identity) -> Want {
    match identity {
        Identity::Anonymous => Want::Anonymous,
        Identity::SelfSigned { .. } => Want::SelfSigned,
        Identity::Node { .. } => Want::Node,
        Identity::User { name, .. } => Want::User(if name == "owner" { "owner" } else { "other" }),
        Identity::Operator { role, .. } => Want::Operator(*role),
        Identity::Invalid { .. } => Want::Invalid,
    }
}

/// An owner certificate (1 h) and a CRL revoking it.
fn revoked_again(ca: &pki::Ca, pk: &[u8; 32]) -> (Option<Vec<u8>>, Vec<u8>) {
    let issued = ca
        .issue(
            &Template {
                common_name: "owner".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                usage: Usage::Client,
                lifetime: Duration::from_secs(3600),
                kind: CertificateKind::Owner,
            },
            pk,
        )
        .unwrap();
    let crl = ca.crl(std::slice::from_ref(&issued.serial), 3).unwrap();
    (Some(issued.der), crl)
}

#[test]
fn classification_table() {
    let (ca, crl, authenticator) = cluster();
    let key = identity::NodeKey::generate().unwrap();
    let pk = key.public_key();
    let id = key.node_id();
    let other_id = identity::NodeKey::generate().unwrap().node_id();
    let foreign = pki::Ca::generate("Foreign CA", pki::CA_LIFETIME).unwrap();
    let self_signed = self_signed(&key).unwrap().certificate;
    let expired = ca
        .issue_at(
            &Template {
                common_name: "owner".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                usage: Usage::Client,
                lifetime: Duration::from_secs(3600),
                kind: CertificateKind::Owner,
            },
            &pk,
            time::OffsetDateTime::now_utc() - time::Duration::days(2),
        )
        .unwrap()
        .der;
    let revoked = ca.issue(
        &Template {
            common_name: "owner".into(),
            dns_names: vec![],
            ip_addresses: vec![],
            usage: Usage::Client,
            lifetime: Duration::from_secs(3600),
            kind: CertificateKind::Owner,
        },
        &pk,
    );
    let revoked = revoked.unwrap();
    let crl_with_revoked = ca.crl(std::slice::from_ref(&revoked.serial), 2).unwrap();

    let check = |name: &str, cert: Option<Vec<u8>>, crl: &[u8], want: Want| {
        let cert = cert.map(CertificateDer::from);
        let got = authenticator.classify(cert.as_ref(), &only(&ca, crl), UnixTime::now());
        assert_eq!(kind_of(&got), want, "{name}: {got}");
    };
    let owner = CertificateKind::Owner;
    let node = CertificateKind::Node;
    check("no certificate", None, &crl, Want::Anonymous);
    check("self-signed", Some(self_signed), &crl, Want::SelfSigned);
    let c = issue(&ca, &pk, "owner", owner);
    check("owner mark", Some(c), &crl, Want::User("owner"));
    let c = issue(&ca, &pk, &id, node);
    check("node mark, own ID", Some(c), &crl, Want::Node);
    let c = issue(&ca, &pk, &other_id, node);
    check("node mark, other ID", Some(c), &crl, Want::Invalid);
    let c = issue(&ca, &pk, "owner", node);
    check("node mark, owner name", Some(c), &crl, Want::Invalid);
    let c = issue(&ca, &pk, &id, owner);
    check("owner mark, node ID", Some(c), &crl, Want::Invalid);
    let c = issue(&ca, &pk, "", owner);
    check("owner mark, empty name", Some(c), &crl, Want::Invalid);
    let c = issue(&ca, &pk, &id, CertificateKind::EtcdPeer);
    check("etcd peer mark", Some(c), &crl, Want::Invalid);
    let c = issue(&ca, &pk, &id, CertificateKind::Curator);
    check(
        "curator mark (a server's only)",
        Some(c),
        &crl,
        Want::Invalid,
    );
    let c = unmarked(&ca, &key, "owner");
    check("no mark, owner-like name", Some(c), &crl, Want::Invalid);
    let c = unmarked(&ca, &key, &id);
    check("no mark, node ID", Some(c), &crl, Want::Invalid);
    check("expired owner", Some(expired), &crl, Want::Invalid);
    let c = Some(revoked.der.clone());
    check("revoked owner", c, &crl_with_revoked, Want::Invalid);
    // Revocation is named as such: a node learns from it that it left the cluster.
    let leaf = CertificateDer::from(revoked.der.clone());
    let got = authenticator.classify(Some(&leaf), &only(&ca, &crl_with_revoked), UnixTime::now());
    assert!(
        matches!(&got, Identity::Invalid { reason } if reason.contains(crate::REVOKED)),
        "{got:?}"
    );
    let c = Some(revoked.der);
    check("owner before revocation", c, &crl, Want::User("owner"));
    let c = issue(&foreign, &pk, "owner", owner);
    check("foreign CA, owner mark", Some(c), &crl, Want::Invalid);
    // Remembered verdicts never outlive a revocation or the certificate's lifetime.
    let c = revoked_again(&ca, &pk);
    check("owner, remembered", c.0.clone(), &crl, Want::User("owner"));
    check(
        "owner, remembered again",
        c.0.clone(),
        &crl,
        Want::User("owner"),
    );
    check("remembered, then revoked", c.0.clone(), &c.1, Want::Invalid);
    let cert = c.0.map(CertificateDer::from);
    let later =
        UnixTime::since_unix_epoch(Duration::from_secs(UnixTime::now().as_secs() + 2 * 3600));
    let got = authenticator.classify(cert.as_ref(), &only(&ca, &crl), later);
    assert_eq!(
        kind_of(&got),
        Want::Invalid,
        "remembered past its expiry: {got}"
    );
    let c = b"not a certificate".to_vec();
    check("garbage", Some(c), &crl, Want::Invalid);
    // Operators: the role from the mark, the name checked.
    for role in pki::OperatorRole::ALL {
        let kind = CertificateKind::Operator(role);
        let c = issue(&ca, &pk, "ada", kind);
        check(role.name(), Some(c), &crl, Want::Operator(role));
        let c = issue(&ca, &pk, "owner", kind);
        check(
            "operator mark, the owner's name",
            Some(c),
            &crl,
            Want::Invalid,
        );
        let c = issue(&ca, &pk, &id, kind);
        check("operator mark, node ID", Some(c), &crl, Want::Invalid);
        let c = issue(&ca, &pk, "Ada.B", kind);
        check("operator mark, bad name", Some(c), &crl, Want::Invalid);
    }
}

/// While a CA is rotated, certificates of both CAs verify, each against its own CA's
/// CRL; one of a CA whose CRL is not known is refused; once the old CA is retired its
/// certificates are refused, by clients and servers alike.
#[tokio::test]
async fn two_trusted_cas_each_checked_against_its_own_crl() {
    let (old, old_crl, authenticator) = cluster();
    let new = pki::Ca::generate("Polis Cluster CA 2", pki::CA_LIFETIME).unwrap();
    let new_crl = new.crl(&[], 1).unwrap();
    let key = identity::NodeKey::generate().unwrap();
    let pk = key.public_key();
    let both = Anchors {
        cas: vec![old.cert_der.clone(), new.cert_der.clone()],
        crls: vec![old_crl.clone(), new_crl.clone()],
    };
    let owner_of =
        |ca: &pki::Ca| CertificateDer::from(issue(ca, &pk, "owner", CertificateKind::Owner));
    let is_owner = |got: &Identity| matches!(got, Identity::User { name, .. } if name == "owner");
    let now = UnixTime::now();
    for ca in [&old, &new] {
        let got = authenticator.classify(Some(&owner_of(ca)), &both, now);
        assert!(is_owner(&got), "{got:?}");
    }
    // The new CA's CRL missing: its certificates' status is unknown, and they are refused.
    let without_new_crl = Anchors {
        crls: vec![old_crl.clone()],
        ..both.clone()
    };
    let got = authenticator.classify(Some(&owner_of(&new)), &without_new_crl, now);
    assert!(matches!(got, Identity::Invalid { .. }), "{got:?}");
    // Revoked on the new CA's CRL: refused, named as revoked.
    let revoked = new
        .issue(
            &Template {
                common_name: "owner".into(),
                dns_names: vec![],
                ip_addresses: vec![],
                usage: Usage::ServerAndClient,
                lifetime: Duration::from_secs(3600),
                kind: CertificateKind::Owner,
            },
            &pk,
        )
        .unwrap();
    let revoking = Anchors {
        crls: vec![
            old_crl.clone(),
            new.crl(std::slice::from_ref(&revoked.serial), 2).unwrap(),
        ],
        ..both.clone()
    };
    let got = authenticator.classify(Some(&CertificateDer::from(revoked.der)), &revoking, now);
    assert!(
        matches!(&got, Identity::Invalid { reason } if reason.contains(crate::REVOKED)),
        "{got:?}"
    );
    // Retired: only the new CA is trusted.
    let retired = Anchors::one(new.cert_der.clone(), Some(new_crl.clone()));
    let got = authenticator.classify(Some(&owner_of(&old)), &retired, now);
    assert!(matches!(got, Identity::Invalid { .. }), "{got:?}");

    // Clients: curators of either CA are accepted while both are trusted.
    let slot = TrustSlot::new(old.cert_der.clone());
    slot.offer(&old_crl).unwrap();
    assert!(slot.trust(both.cas.clone()).unwrap());
    slot.offer(&new_crl).unwrap();
    let trust = ServerTrust::ClusterCa {
        trust: slot.clone(),
    };
    let (old_curator, _) = serving(&old, &key, CertificateKind::Curator);
    let (new_curator, _) = serving(&new, &key, CertificateKind::Curator);
    handshake(&old_curator, &trust)
        .await
        .expect("old CA's curator");
    handshake(&new_curator, &trust)
        .await
        .expect("new CA's curator");
    assert!(slot.trust(vec![new.cert_der.clone()]).unwrap());
    handshake(&new_curator, &trust)
        .await
        .expect("new CA's curator, after");
    let refused = handshake(&old_curator, &trust).await.unwrap_err();
    assert!(refused.contains("UnknownIssuer"), "{refused}");
}
