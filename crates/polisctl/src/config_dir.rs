//! The files in the config directory, and nothing else: reading and writing them.
//!
//! ```text
//!   <config>/owner-key.pem    the owner's Ed25519 private key (PKCS#8 PEM)   0600
//!   <config>/owner.pem        the owner certificate from `takeownership`      0600
//!   <config>/ca.pem           the pinned cluster CA certificate               0600
//!   <config>/crl.pem          the newest cluster CRL polisctl has seen        0600
//!   <config>/endpoints        the cluster's curators, one per line            0600
//!   <config>/epoch            the newest cluster epoch polisctl has seen      0600
//! ```
//! Invariants: the directory is 0700 and every file in it 0600, written atomically; a key
//! file readable by others is refused, as ssh does.
//! May not talk to the cluster or print results (a leaf: it uses no other module).

use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use identity::NodeKey;

pub(crate) fn owner_key_path(config: &Path) -> PathBuf {
    config.join("owner-key.pem")
}

/// Loads the owner key, creating it (and the 0700 config directory) if absent.
pub(crate) fn ensure_owner_key(config: &Path) -> Result<NodeKey> {
    if !config.exists() {
        privatefs::ensure_private_dir(config)?;
    }
    let mode = fs::metadata(config)
        .with_context(|| format!("reading {}", config.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "config directory {} has permissions {:o}, which let others in; chmod 700 it",
            config.display(),
            mode & 0o777
        );
    }
    let path = owner_key_path(config);
    if path.exists() {
        return load_owner_key(&path);
    }
    let key = NodeKey::generate().context("generating the owner key")?;
    let pem = pem::encode(&pem::Pem::new("PRIVATE KEY", key.pkcs8_der()));
    write_private(&path, pem.as_bytes())
        .with_context(|| format!("writing owner key to {}", path.display()))?;
    eprintln!("created owner key {}", path.display());
    Ok(key)
}

pub(crate) fn load_owner_key(path: &Path) -> Result<NodeKey> {
    let mode = fs::metadata(path)
        .with_context(|| format!("reading owner key {}", path.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        bail!(
            "owner key {} has permissions {:o}, which are too open; chmod 600 it",
            path.display(),
            mode & 0o777
        );
    }
    let text = fs::read_to_string(path)
        .with_context(|| format!("reading owner key {}", path.display()))?;
    let parsed = pem::parse(&text)
        .with_context(|| format!("owner key {} is not a PEM file", path.display()))?;
    if parsed.tag() != "PRIVATE KEY" {
        bail!(
            "owner key {} holds a {}, not a PRIVATE KEY",
            path.display(),
            parsed.tag()
        );
    }
    NodeKey::from_pkcs8(parsed.contents())
        .with_context(|| format!("owner key {} is not an Ed25519 key", path.display()))
}

/// Writes a 0600 file atomically (see `privatefs`).
pub(crate) fn write_private(path: &Path, contents: &[u8]) -> Result<()> {
    Ok(privatefs::write_atomic(path, contents)?)
}

pub(crate) fn owner_certificate_path(config: &Path) -> PathBuf {
    config.join("owner.pem")
}

pub(crate) fn ca_path(config: &Path) -> PathBuf {
    config.join("ca.pem")
}

/// When a curator last answered this configuration under its pinned CA (unix seconds,
/// one line): a handover of a CA this configuration pins is followed only within
/// [`crate::trust::HANDOVER_WINDOW_SECS`] of that (`trust::follow_handover`).
pub(crate) fn ca_confirmed_path(config: &Path) -> PathBuf {
    config.join("ca-confirmed")
}

/// Records that a curator answered under the pinned CA now (at most once an hour).
pub(crate) fn confirm_ca(config: &Path) -> Result<()> {
    let now = pki::unix_now();
    if ca_confirmed_unix(config).is_some_and(|at| at <= now && now - at < 3600) {
        return Ok(());
    }
    let path = ca_confirmed_path(config);
    write_private(&path, format!("{now}\n").as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

/// When the pinned CA was last confirmed: the `ca-confirmed` file, else (a
/// configuration made before it existed) when the CA was pinned (`ca.pem`'s time).
pub(crate) fn ca_confirmed_unix(config: &Path) -> Option<u64> {
    if let Ok(text) = std::fs::read_to_string(ca_confirmed_path(config))
        && let Ok(at) = text.trim().parse()
    {
        return Some(at);
    }
    let modified = std::fs::metadata(ca_path(config)).ok()?.modified().ok()?;
    modified
        .duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs())
}

/// The newest cluster CRL polisctl has seen: curators' certificates are checked
/// against it, so that a removed node cannot pose as one.
pub(crate) fn crl_path(config: &Path) -> PathBuf {
    config.join("crl.pem")
}

/// The newest cluster epoch polisctl has seen (`rpc::epoch`): answers of curators of
/// an older one are refused.
pub(crate) fn epoch_path(config: &Path) -> PathBuf {
    config.join("epoch")
}

/// An epoch slot holding the saved epoch, saving every newer one it is offered.
pub(crate) fn saved_epoch(config: &Path) -> Result<rpc::epoch::EpochSlot> {
    let path = epoch_path(config);
    let seen = match fs::read_to_string(&path) {
        Ok(text) => Some(rpc::epoch::from_saved_text(&text).with_context(|| {
            format!(
                "the saved cluster epoch in {} is malformed; remove it",
                path.display()
            )
        })?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let save = std::sync::Arc::new(move |epoch: &proto::config::ClusterEpoch| {
        let line = rpc::epoch::saved_text(epoch);
        if let Err(e) = privatefs::write_atomic(&path, line.as_bytes()) {
            eprintln!(
                "warning: could not save the cluster epoch in {}: {e}",
                path.display()
            );
        }
    });
    Ok(rpc::epoch::EpochSlot::new(seen, Some(save)))
}

/// Every block tagged `tag` in the PEM file `path` (none when it does not exist).
pub(crate) fn read_pem_blocks(path: &Path, tag: &str, what: &str) -> Result<Vec<Vec<u8>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {what} {}", path.display())),
    };
    let blocks = pem::parse_many(&text)
        .with_context(|| format!("{what} {} is not a PEM file", path.display()))?;
    blocks
        .into_iter()
        .map(|b| {
            if b.tag() != tag {
                bail!("{what} {} holds a {}, not a {tag}", path.display(), b.tag());
            }
            Ok(b.into_contents())
        })
        .collect()
}

pub(crate) fn write_pem_blocks(path: &Path, tag: &str, ders: &[Vec<u8>]) -> Result<()> {
    let text: String = ders
        .iter()
        .map(|der| pem::encode(&pem::Pem::new(tag, der.clone())))
        .collect();
    write_private(path, text.as_bytes()).with_context(|| format!("writing {}", path.display()))
}

/// The cluster CAs pinned in `config` (`ca.pem`: one, or during and after a CA
/// rotation every CA the cluster trusted when last asked, the signing one first).
pub(crate) fn pinned_cas(config: &Path) -> Result<Vec<Vec<u8>>> {
    let cas = read_pem_blocks(&ca_path(config), "CERTIFICATE", "pinned CA")?;
    if cas.is_empty() {
        bail!(
            "no pinned cluster CA in {}; run `polisctl takeownership` first",
            config.display()
        );
    }
    Ok(cas)
}

/// A trust slot holding `cas` and the saved CRLs that one of them signed; refused when
/// CRLs are saved and none of them is this cluster's.
pub(crate) fn saved_crl(config: &Path, cas: &[Vec<u8>]) -> Result<rpc::TrustSlot> {
    let first = cas.first().context("no cluster CA to trust")?;
    let slot = rpc::TrustSlot::new(first.clone());
    slot.trust(cas.to_vec())
        .with_context(|| format!("the pinned CAs in {}", ca_path(config).display()))?;
    let saved = read_pem_blocks(&crl_path(config), "X509 CRL", "cluster CRL")?;
    let mut refusals = Vec::new();
    for crl in &saved {
        if let Err(e) = slot.offer(crl) {
            refusals.push(e);
        }
    }
    if !saved.is_empty() && refusals.len() == saved.len() {
        return Err(anyhow!("{}", refusals.remove(0))).with_context(|| {
            format!(
                "the saved cluster CRL {} is not this cluster's; remove it",
                crl_path(config).display()
            )
        });
    }
    Ok(slot)
}

/// Before a CA is first pinned in `config`: a saved CRL that `ca` did not sign was left
/// by another cluster this directory once belonged to. It is removed (it can revoke
/// nothing of this cluster; the cluster's own CRL is fetched with the first session),
/// so that `takeownership` never writes half a configuration and then fails on it.
/// Returns whether one was removed. An unreadable file is an error, left in place.
pub(crate) fn drop_foreign_crl(config: &Path, ca: &[u8]) -> Result<bool> {
    let Some(crl) = read_pem(&crl_path(config), "X509 CRL", "cluster CRL")? else {
        return Ok(false);
    };
    if rpc::TrustSlot::new(ca.to_vec()).offer(&crl).is_ok() {
        return Ok(false);
    }
    fs::remove_file(crl_path(config))
        .with_context(|| format!("removing {}", crl_path(config).display()))?;
    Ok(true)
}

pub(crate) fn read_pem(path: &Path, tag: &str, what: &str) -> Result<Option<Vec<u8>>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {what} {}", path.display())),
    };
    let parsed = pem::parse(&text)
        .with_context(|| format!("{what} {} is not a PEM file", path.display()))?;
    if parsed.tag() != tag {
        bail!(
            "{what} {} holds a {}, not a {tag}",
            path.display(),
            parsed.tag()
        );
    }
    Ok(Some(parsed.into_contents()))
}

pub(crate) fn write_pem(path: &Path, tag: &str, der: &[u8]) -> Result<()> {
    write_private(path, pem::encode(&pem::Pem::new(tag, der)).as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn endpoints_path(config: &Path) -> PathBuf {
    config.join("endpoints")
}

fn parse_endpoints(raw: &[String]) -> Result<Vec<SocketAddr>> {
    Ok(rpc::parse_endpoints(raw)?)
}

/// The curators to talk to: `--endpoints` when given, else those remembered in the
/// config directory (written by `takeownership`, refreshed from the cluster).
pub(crate) fn endpoints(config: &Path, raw: &[String]) -> Result<Vec<SocketAddr>> {
    if !raw.is_empty() {
        return parse_endpoints(raw);
    }
    let path = endpoints_path(config);
    let remembered = match std::fs::read_to_string(&path) {
        Ok(text) => text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(str::to_string)
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    if remembered.is_empty() {
        bail!(
            "no curator endpoint given and none remembered in {}; pass --endpoints IP[:PORT]",
            path.display()
        );
    }
    parse_endpoints(&remembered).with_context(|| format!("{} is corrupt", path.display()))
}

/// Remembers the cluster's curators in the config directory (when they changed).
pub(crate) fn remember_endpoints(config: &Path, endpoints: &[String]) -> Result<()> {
    if endpoints.is_empty() {
        return Ok(());
    }
    let path = endpoints_path(config);
    let text = format!(
        "# curator endpoints, refreshed by polisctl from the cluster\n{}\n",
        endpoints.join("\n")
    );
    if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
        write_private(&path, text.as_bytes())
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_key_is_created_once_with_private_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cfg");
        let a = ensure_owner_key(&config).unwrap();
        let b = ensure_owner_key(&config).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        let dir_mode = fs::metadata(&config).unwrap().permissions().mode() & 0o777;
        let key_mode = fs::metadata(owner_key_path(&config))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!((dir_mode, key_mode), (0o700, 0o600));
    }

    #[test]
    fn a_crl_of_another_cluster_is_dropped_and_this_clusters_kept() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path();
        let old = pki::Ca::generate("old cluster", std::time::Duration::from_secs(3600)).unwrap();
        let new = pki::Ca::generate("new cluster", std::time::Duration::from_secs(3600)).unwrap();
        assert!(
            !drop_foreign_crl(config, &new.cert_der).unwrap(),
            "no CRL saved"
        );
        write_pem(&crl_path(config), "X509 CRL", &old.crl(&[], 1).unwrap()).unwrap();
        assert!(saved_crl(config, std::slice::from_ref(&new.cert_der)).is_err());
        assert!(drop_foreign_crl(config, &new.cert_der).unwrap());
        assert!(!crl_path(config).exists());
        assert!(saved_crl(config, std::slice::from_ref(&new.cert_der)).is_ok());
        write_pem(&crl_path(config), "X509 CRL", &new.crl(&[], 2).unwrap()).unwrap();
        assert!(!drop_foreign_crl(config, &new.cert_der).unwrap());
        assert!(crl_path(config).exists(), "this cluster's CRL is kept");
    }

    #[test]
    fn too_open_key_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cfg");
        ensure_owner_key(&config).unwrap();
        let key = owner_key_path(&config);
        fs::set_permissions(&key, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ensure_owner_key(&config).unwrap_err().to_string();
        assert!(err.contains("too open"), "{err}");
    }
}
