//! The version-skew policy on a real cluster: a node one minor version from its curator
//! works (UP, HEALTHY) and `polisctl cluster versions` lets the next upgrade step start;
//! a node two minor versions away has its heartbeats refused with both versions named,
//! and `cluster versions` says the upgrade may not proceed (exit 1); a root written in a
//! newer format than this build reads is refused at start, and a curator does not lead
//! an etcd key layout of a newer format.
//!
//! Test builds make a node report another version (`POLIS_TEST_REPORTED_VERSION`); the
//! curator is this build's version.

use anyhow::{Context, Result, ensure};
use e2e::{Cluster, TIMEOUT};

/// This build's version with its minor number moved by `by`.
fn minor_step(by: u64) -> Result<String> {
    let own = proto::version::parse(env!("CARGO_PKG_VERSION")).context("own version")?;
    Ok(format!("{}.{}.0", own.major, own.minor + by))
}

#[test]
fn one_minor_version_apart_works_two_are_refused_and_named() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::bootstrap(dir.path())?;
    let params = cluster.register_params("skew")?;
    let join = |name: &str, version: &str| -> Result<(e2e::Node, String)> {
        let mut node = cluster.new_node(name)?;
        node.start_with_env(
            &["--params", params.to_str().context("utf-8 path")?],
            &[("POLIS_TEST_REPORTED_VERSION", version)],
        )?;
        node.wait_state("Foreign")?;
        let id = node.key_node_id()?;
        cluster.ctl_retry(&["node", "approve", &id])?;
        cluster.wait_node(&id, "UP", None)?;
        Ok((node, id))
    };

    // One minor version ahead of the curator: within the policy.
    let near_version = minor_step(1)?;
    let (near_node, near) = join("near", &near_version)?;
    cluster.wait_node(&near, "UP", Some("HEALTHY"))?;
    let out = cluster.ctl_retry(&["cluster", "versions"])?;
    ensure!(out.contains(&near_version), "{out}");
    ensure!(out.contains("upgrade can proceed: yes"), "{out}");
    let json: serde_json::Value =
        serde_json::from_str(&cluster.ctl_retry(&["cluster", "versions", "-o", "json"])?)?;
    ensure!(json["upgrade_can_proceed"] == true, "{json}");
    ensure!(json["newest"] == near_version.as_str(), "{json}");

    // Two minor versions ahead: every heartbeat refused, both versions named.
    let far_version = minor_step(2)?;
    let (mut far_node, far) = join("far", &far_version)?;
    let refusal = format!(
        "node version {far_version} and curator version {}",
        env!("CARGO_PKG_VERSION")
    );
    far_node
        .proc()
        .wait_for_line(TIMEOUT, |l| {
            l.contains(&refusal) && l.contains("outside the version-skew policy")
        })
        .context("the far node to log its refused heartbeat")?;
    let (ok, out, err) = cluster.ctl(&["cluster", "versions"])?;
    ensure!(
        !ok,
        "cluster versions exits 1 while a node is refused: {out}"
    );
    ensure!(out.contains("upgrade can proceed: NO"), "{out}");
    ensure!(
        out.contains(&far) && err.contains("an upgrade step may not start"),
        "{out}\n{err}"
    );
    // The refused version is recorded and shown, with what the policy says of it; the
    // refused heartbeats do not make the node HEALTHY.
    let mut shown = serde_json::Value::Null;
    e2e::wait_until(
        "cluster versions to show the refused version",
        TIMEOUT,
        || {
            let Ok((_, out, _)) = cluster.ctl(&["cluster", "versions", "-o", "json"]) else {
                return false;
            };
            let Ok(json) = serde_json::from_str::<serde_json::Value>(&out) else {
                return false;
            };
            shown = json["nodes"]
                .as_array()
                .and_then(|nodes| nodes.iter().find(|n| n["id"] == far.as_str()).cloned())
                .unwrap_or_default();
            shown["version"] == far_version.as_str()
        },
    )
    .with_context(|| format!("the far node as shown: {shown}"))?;
    ensure!(
        shown["verdict"]
            .as_str()
            .is_some_and(|v| v.contains("more than one minor version ahead")),
        "{shown}"
    );
    ensure!(shown["health"] != "HEALTHY", "{shown}");
    // The near node is not held up by the far one.
    cluster.wait_node(&near, "UP", Some("HEALTHY"))?;

    // A root written in a newer format is refused before anything is read, both formats
    // named; the root is left as it was.
    let mut near_node = near_node;
    near_node.stop_cleanly()?;
    let format_file = near_node.root.join("format");
    let ours = std::fs::read_to_string(&format_file).context("the root's format")?;
    let newer: u32 = ours.trim().parse::<u32>()? + 1;
    std::fs::write(&format_file, format!("{newer}\n"))?;
    near_node.start(&[])?;
    let status = near_node.proc().wait_exit(TIMEOUT)?;
    ensure!(status.code() == Some(1), "{status:?}");
    let output = near_node.proc().output();
    ensure!(
        output.contains(&format!(
            "has format {newer}, written by a newer polis-node"
        )) && output.contains(&format!("up to {}", ours.trim())),
        "{output}"
    );
    ensure!(std::fs::read_to_string(&format_file)? == format!("{newer}\n"));

    // The etcd key layout carries its format: recorded by the first leader, and a newer
    // one (as a newer polis-node would leave it) is never led by this build.
    let layout_key = "namespaced:curator/cluster/layout-format";
    let member = &mut cluster.first;
    let recorded = member.etcdctl(&["get", "--print-value-only", layout_key])?;
    ensure!(
        recorded.trim() == "1",
        "layout format recorded: {recorded:?}"
    );
    member.etcdctl(&["put", layout_key, "2"])?;
    member.stop_cleanly()?;
    member.start(&[])?;
    member
        .proc()
        .wait_for_line(TIMEOUT, |l| {
            l.contains("etcd key layout has format 2, written by a newer polis-node")
                && l.contains("reads layout formats up to 1")
        })
        .context("the curator to refuse a newer layout")?;
    let (ok, _, err) = cluster.ctl(&["node", "list"])?;
    ensure!(!ok, "a curator led a layout it does not know: {err}");
    // Set back (as the newer binary would be put back), the curator leads again.
    cluster.first.etcdctl(&["put", layout_key, "1"])?;
    cluster.ctl_retry(&["node", "list"])?;
    Ok(())
}
