//! Stale views: which WatchNode update a node may apply. Every update names the etcd
//! revision its record was last modified at (and the etcd cluster that counts it); a node
//! never applies one older than the newest it applied, from any curator, also across a
//! restart (the newest is kept in the cluster directory, `esp/directory.pb`). A curator
//! whose view is old can thus never take back a role or a state a current one gave.
//!
//! Decides and records only: may not talk to a curator or act on an update.

use anyhow::{Context as _, Result};
use proto::config::ClusterDirectory;

use crate::disk::storage::{Root, read_proto, write_proto};

/// What one applied WatchNode update reflected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppliedView {
    /// The etcd cluster the revision counts in (0: the curator did not say).
    pub etcd_cluster: u64,
    /// The etcd revision the node's record was last modified at.
    pub revision: i64,
}

impl AppliedView {
    pub fn of(update: &proto::api::WatchNodeUpdate) -> AppliedView {
        AppliedView {
            etcd_cluster: update.record_etcd_cluster,
            revision: update.record_revision,
        }
    }
}

/// Whether `update` is older than what the node already applied. Revisions of another
/// etcd cluster (a restored one counts anew) are not compared; an update that names no
/// cluster is compared as if it were the same one.
pub fn is_stale(applied: Option<AppliedView>, update: AppliedView) -> bool {
    applied.is_some_and(|a| {
        (update.etcd_cluster == a.etcd_cluster || update.etcd_cluster == 0)
            && update.revision < a.revision
    })
}

/// The newest applied view recorded in the root's cluster directory, if any.
pub fn load(root: &Root) -> Option<AppliedView> {
    let directory: ClusterDirectory = read_proto(&root.directory(), "cluster directory").ok()?;
    let view = AppliedView {
        etcd_cluster: directory.applied_record_etcd_cluster,
        revision: directory.applied_record_revision,
    };
    (view != AppliedView::default()).then_some(view)
}

/// Records `view` as the newest applied one in the cluster directory (when it changed).
pub fn save(root: &Root, view: AppliedView) -> Result<()> {
    let path = root.directory();
    let current: ClusterDirectory = read_proto(&path, "cluster directory").unwrap_or_default();
    let next = ClusterDirectory {
        applied_record_revision: view.revision,
        applied_record_etcd_cluster: view.etcd_cluster,
        ..current.clone()
    };
    if next != current {
        write_proto(&path, &next).context("recording the newest applied node record revision")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(etcd_cluster: u64, revision: i64) -> AppliedView {
        AppliedView {
            etcd_cluster,
            revision,
        }
    }

    #[test]
    fn older_updates_are_stale_equal_and_newer_are_not() {
        assert!(!is_stale(None, view(7, 1)));
        assert!(is_stale(Some(view(7, 10)), view(7, 9)));
        assert!(!is_stale(Some(view(7, 10)), view(7, 10)));
        assert!(!is_stale(Some(view(7, 10)), view(7, 11)));
    }

    #[test]
    fn another_cluster_counts_anew_but_an_unnamed_one_does_not() {
        assert!(!is_stale(Some(view(7, 10)), view(8, 3)));
        assert!(is_stale(Some(view(7, 10)), view(0, 0)));
        assert!(is_stale(Some(view(7, 10)), view(0, 9)));
    }

    #[test]
    fn the_view_survives_in_the_directory_next_to_the_endpoints() {
        let dir = tempfile::tempdir().unwrap();
        let root = Root::new(dir.path().to_path_buf());
        std::fs::create_dir_all(root.directory().parent().unwrap()).unwrap();
        assert_eq!(load(&root), None);
        crate::disk::files::save_directory(&root, &["10.0.0.1:7835".into()]).unwrap();
        save(&root, view(7, 42)).unwrap();
        crate::disk::files::save_directory(&root, &["10.0.0.2:7835".into()]).unwrap();
        assert_eq!(load(&root), Some(view(7, 42)));
        assert_eq!(
            crate::disk::files::read_directory(&root).unwrap(),
            vec!["10.0.0.2:7835".parse().unwrap()]
        );
    }
}
