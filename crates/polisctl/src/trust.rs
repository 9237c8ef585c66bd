//! Taking ownership of a cluster: the first contact, the operator's approval of the
//! cluster CA (pinned from then on), and the first owner certificate (or, for an
//! operator's key, the first operator certificate: the same flow, the same files).
//! Also here: following a CA's handovers to the CA that replaced it
//! ([`follow_handover`]), the one way a pin changes without the operator.
//! May not print anything but its own prompt and result; built on `session`.

use std::io::{BufRead, IsTerminal, Write};
use std::net::SocketAddr;
use std::path::Path;

use anyhow::{Context, Result, anyhow, bail};
use proto::api;
use tonic::transport::Channel;

use crate::config_dir::{
    ca_confirmed_unix, ca_path, confirm_ca, crl_path, drop_foreign_crl, endpoints, epoch_path,
    load_owner_key, owner_certificate_path, owner_key_path, read_pem, saved_crl, write_pem,
};
use crate::session::{OwnerSession, call_error, escrow};

/// How the operator approves the cluster CA on first contact.
pub(crate) enum CaApproval {
    Accept,
    Fingerprint(String),
    Ask,
}

/// Connects to the first reachable endpoint.
async fn connect(
    endpoints: &[SocketAddr],
    trust: &rpc::ServerTrust,
    credentials: Option<&rpc::Credentials>,
) -> Result<Channel> {
    let mut last = None;
    for e in endpoints {
        match rpc::connect(*e, trust, credentials).await {
            Ok(c) => return Ok(c),
            Err(err) => last = Some(err),
        }
    }
    Err(last
        .map(anyhow::Error::from)
        .unwrap_or_else(|| anyhow!("no endpoints")))
}

fn normalize_fingerprint(f: &str) -> String {
    f.trim()
        .trim_start_matches("SHA256:")
        .chars()
        .filter(|c| *c != ':')
        .collect::<String>()
        .to_ascii_lowercase()
}

fn approve_ca(fingerprint: &str, approval: &CaApproval) -> Result<()> {
    match approval {
        CaApproval::Accept => Ok(()),
        CaApproval::Fingerprint(expected) => {
            if normalize_fingerprint(expected) == fingerprint {
                Ok(())
            } else {
                bail!(
                    "CA fingerprint mismatch: the cluster presents SHA256:{fingerprint}, expected {}",
                    expected.trim()
                )
            }
        }
        CaApproval::Ask => {
            if !std::io::stdin().is_terminal() {
                bail!(
                    "the cluster CA (SHA256:{fingerprint}) is not pinned yet and there is no terminal to confirm it; \
                     pass --accept-ca or --ca-fingerprint HEX"
                );
            }
            eprint!(
                "The cluster CA certificate has SHA-256 fingerprint\n  {fingerprint}\nPin it and continue? [y/N] "
            );
            std::io::stderr().flush().ok();
            let mut answer = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut answer)
                .context("reading the answer")?;
            if matches!(answer.trim(), "y" | "Y" | "yes" | "YES") {
                Ok(())
            } else {
                bail!("CA not accepted; nothing changed")
            }
        }
    }
}

pub(crate) async fn take_ownership(
    config: &Path,
    raw_endpoints: &[String],
    approval: CaApproval,
) -> Result<()> {
    let endpoints = endpoints(config, raw_endpoints)?;
    let key_path = owner_key_path(config);
    if !key_path.exists() {
        bail!(
            "no owner key at {}; it is created by `polisctl params bootstrap` for the cluster you own, \
             or by `polisctl key` for an operator an admin then adds",
            key_path.display()
        );
    }
    let key = load_owner_key(&key_path)?;

    // First contact: fetch the CA over TLS without trusting the server yet.
    let channel = connect(&endpoints, &rpc::ServerTrust::FirstUse, None).await?;
    let ca = api::curator_local_client::CuratorLocalClient::new(channel)
        .get_ca_certificate(api::GetCaCertificateRequest::default())
        .await
        .map_err(|s| call_error("fetching the cluster CA", s))?
        .into_inner()
        .ca_certificate;
    let fingerprint = rpc::fingerprint(&ca);
    match read_pem(&ca_path(config), "CERTIFICATE", "pinned CA")? {
        Some(pinned) if pinned == ca => {}
        Some(pinned) => bail!(
            "CA fingerprint mismatch: {} pins SHA256:{}, but the endpoint presents SHA256:{fingerprint}",
            ca_path(config).display(),
            rpc::fingerprint(&pinned)
        ),
        None => {
            approve_ca(&fingerprint, &approval)?;
            if drop_foreign_crl(config, &ca)? {
                eprintln!(
                    "Removed {}: it was another cluster's CRL (not signed by this CA).",
                    crl_path(config).display()
                );
            }
            // An epoch seen without a pinned CA was another cluster's.
            match std::fs::remove_file(epoch_path(config)) {
                Ok(()) => eprintln!(
                    "Removed {}: it was another cluster's epoch.",
                    epoch_path(config).display()
                ),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e)
                        .with_context(|| format!("removing {}", epoch_path(config).display()));
                }
            }
        }
    }
    // With the CA pinned already, a CRL it did not sign is refused now, before anything
    // is written, rather than by the first session after the owner certificate was.
    saved_crl(config, std::slice::from_ref(&ca))?;

    // Now with the CA pinned: prove the owner key and receive a certificate.
    let response = escrow(
        &endpoints,
        std::slice::from_ref(&ca),
        &key,
        &key_path,
        "taking ownership",
    )
    .await?;
    write_pem(&ca_path(config), "CERTIFICATE", &ca)?;
    confirm_ca(config)?;
    write_pem(
        &owner_certificate_path(config),
        "CERTIFICATE",
        &response.owner_certificate,
    )?;
    // Remember the cluster's curators, so that later commands need no --endpoints.
    let session = OwnerSession::new(
        config,
        endpoints,
        std::slice::from_ref(&ca),
        rpc::Credentials {
            certificate: response.owner_certificate.clone(),
            key_pkcs8: key.pkcs8_der().to_vec(),
        },
    )?;
    session.cluster_info().await?;
    match operator_of(&response.owner_certificate) {
        Some((name, role)) => {
            println!(
                "Signed in to the cluster as operator {} ({role}) (CA SHA256:{fingerprint}).",
                crate::output::escape(&name)
            );
            println!("Certificate: {}", owner_certificate_path(config).display());
        }
        None => {
            println!("Took ownership of the cluster (CA SHA256:{fingerprint}).");
            println!(
                "Owner certificate: {}",
                owner_certificate_path(config).display()
            );
        }
    }
    Ok(())
}

/// After CA rotations this configuration missed (no curator presents a CA it pins):
/// follows the handovers from the CA it pins to the CA the curators present
/// (`pki::handed_over`) and, when they lead there, pins that CA instead (and drops the
/// old CA's CRL). Returns whether it did; the next owner session renews the owner
/// certificate of the old CA under the new one (AAA.Escrow with the same key).
pub(crate) async fn follow_handover(config: &Path, raw_endpoints: &[String]) -> Result<bool> {
    let endpoints = endpoints(config, raw_endpoints)?;
    let pinned = crate::config_dir::pinned_cas(config)?;
    // Unverified on purpose: what it answers is checked against the pinned CA below,
    // and every later call checks the curators against the CA pinned then.
    let channel = connect(&endpoints, &rpc::ServerTrust::FirstUse, None).await?;
    let answer = api::curator_local_client::CuratorLocalClient::new(channel)
        .get_ca_certificate(api::GetCaCertificateRequest {
            with_handovers: true,
        })
        .await
        .map_err(|s| call_error("fetching the cluster CA's handovers", s))?
        .into_inner();
    let presented = answer.ca_certificate;
    if pinned.contains(&presented) || !pki::handed_over(&pinned, &answer.handovers, &presented) {
        return Ok(false);
    }
    let confirmed = ca_confirmed_unix(config);
    if !within_handover_window(confirmed, pki::unix_now()) {
        bail!(
            "the cluster CA was rotated: the CA {} pins (SHA256:{}) handed over to SHA256:{}, \
             but a curator last answered this configuration under its pinned CA {}, longer \
             ago than the {} days a retired CA's handover is followed (whoever holds a retired \
             CA's key could sign one). Check that fingerprint with an admin of the cluster \
             (`polisctl cluster ca`), move {} aside and run `polisctl takeownership \
             --ca-fingerprint <it>` with this configuration",
            ca_path(config).display(),
            rpc::fingerprint(&pinned[0]),
            rpc::fingerprint(&presented),
            confirmed.map_or("never (no record)".to_string(), |at| format!(
                "{} days ago",
                pki::unix_now().saturating_sub(at) / 86_400
            )),
            HANDOVER_WINDOW_SECS / 86_400,
            ca_path(config).display()
        );
    }
    write_pem(&ca_path(config), "CERTIFICATE", &presented)?;
    confirm_ca(config)?;
    drop_foreign_crl(config, &presented)?;
    eprintln!(
        "polisctl: the cluster CA was rotated since this configuration was last used: the CA \
         it pinned (SHA256:{}) handed over to SHA256:{}, pinned now",
        rpc::fingerprint(&pinned[0]),
        rpc::fingerprint(&presented)
    );
    Ok(true)
}

/// How long after a curator last answered a configuration under its pinned CA a
/// handover of that CA is still followed. A CA's key stays valid for 20 years: without
/// a bound, whoever got hold of a retired CA's key could re-pin any idle configuration
/// to a CA of their choosing for that long. With it, a retired key is of use at most
/// this long after the retirement (a configuration used since pins the new CA), and a
/// configuration idle for longer is re-pinned by hand, by fingerprint.
pub(crate) const HANDOVER_WINDOW_SECS: u64 = 180 * 86_400;

/// Whether a handover may be followed by a configuration whose pinned CA was last
/// confirmed at `confirmed` (unix seconds; none: unknown), at `now` (pure).
pub(crate) fn within_handover_window(confirmed: Option<u64>, now: u64) -> bool {
    confirmed.is_some_and(|at| now.saturating_sub(at) <= HANDOVER_WINDOW_SECS)
}

/// The operator name and role a certificate is marked for; `None` for the owner's.
pub(crate) fn operator_of(der: &[u8]) -> Option<(String, pki::OperatorRole)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let Some(pki::CertificateKind::Operator(role)) = pki::CertificateKind::of(&cert) else {
        return None;
    };
    let name = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some((name.to_string(), role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_normalize() {
        assert_eq!(normalize_fingerprint("SHA256:AB:cd"), "abcd");
        assert!(approve_ca("abcd", &CaApproval::Fingerprint("AB:CD".into())).is_ok());
        let err = approve_ca("abcd", &CaApproval::Fingerprint("ffff".into())).unwrap_err();
        assert!(err.to_string().contains("mismatch"));
    }

    #[test]
    fn a_handover_is_followed_only_within_its_window_of_the_last_confirmation() {
        let now = 1_800_000_000;
        assert!(within_handover_window(Some(now), now));
        assert!(within_handover_window(
            Some(now - HANDOVER_WINDOW_SECS),
            now
        ));
        assert!(!within_handover_window(
            Some(now - HANDOVER_WINDOW_SECS - 1),
            now
        ));
        assert!(!within_handover_window(None, now));
        // A confirmation in the future (a clock set back since) does not widen it.
        assert!(within_handover_window(Some(now + 10), now));
    }
}
