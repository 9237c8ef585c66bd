//! Encrypted members killed (issue 18): three consensus members on encrypted loop
//! images (the first one bootstrapped on its image) take acknowledged label writes (a
//! ledger) while all three are killed with SIGKILL, their data left mounted; started
//! again they take their leftover mounts over, unlock each other and serve, and every
//! acknowledged write is there. Root only; skipped with a printed reason where the
//! kernel lacks ext4 encryption.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::{
    Cluster, Mounts, Node, TIMEOUT, data_image, endpoints, fscrypt_usable, pem_der, wait_until,
};
use proto::api;

fn encrypted_node(cluster: &Cluster, name: &str, img: &str) -> Result<(Node, String)> {
    let params = cluster.register_params(name)?;
    cluster.add_worker_with(name, &params, &["--data-device", img])
}

fn owner_client(cluster: &Cluster, nodes: &[&Node]) -> Result<rpc::CuratorClient> {
    let key = identity::NodeKey::from_pkcs8(&pem_der(&cluster.config.join("owner-key.pem"))?)?;
    Ok(rpc::CuratorClient::new(
        nodes
            .iter()
            .map(|n| SocketAddr::new(n.address, rpc::CURATOR_PORT))
            .collect(),
        rpc::ServerTrust::PinnedCa(pem_der(&cluster.config.join("ca.pem"))?),
        Some(rpc::Credentials {
            certificate: pem_der(&cluster.config.join("owner.pem"))?,
            key_pkcs8: key.pkcs8_der().to_vec(),
        }),
    )?)
}

/// Label writes on node `target`, one key per write, each bounded in time; the keys
/// of the acknowledged ones are recorded. At most `max` writes.
fn start_writer(
    client: rpc::CuratorClient,
    target: String,
    max: usize,
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<Result<()>> {
    std::thread::spawn(move || -> Result<()> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        for i in 0..max {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let key = format!("ledger-{i}");
            let request = api::UpdateNodeLabelsRequest {
                id: target.clone(),
                upsert: [(key.clone(), "acked".to_string())].into(),
                delete: vec![],
            };
            let call = client.call(|channel| {
                let request = request.clone();
                async move {
                    api::management_client::ManagementClient::new(channel)
                        .update_node_labels(request)
                        .await
                }
            });
            let answer = runtime
                .block_on(async { tokio::time::timeout(Duration::from_secs(3), call).await });
            if let Ok(Ok(_)) = answer {
                acked.lock().expect("ledger lock").push(key);
            }
        }
        Ok(())
    })
}

#[test]
fn encrypted_members_killed_together_lose_no_acknowledged_write() -> Result<()> {
    if !fscrypt_usable() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let imgs: Vec<String> = ["n0", "m1", "m2"]
        .iter()
        .map(|n| data_image(&dir.path().join(format!("{n}.img"))))
        .collect::<Result<_>>()?;
    let _mounts: Vec<Mounts> = ["n0", "m1", "m2"]
        .iter()
        .map(|n| Mounts(dir.path().join(n).join("root")))
        .collect();
    let n0_dir = dir.path().join("n0");
    std::fs::create_dir_all(&n0_dir)?;
    let mut first = Node::new(&n0_dir);
    let params = first.bootstrap_params()?;
    first.start(&[
        "--params",
        params.to_str().unwrap(),
        "--data-device",
        &imgs[0],
    ])?;
    first.wait_home()?;
    let mut cluster = Cluster {
        dir: dir.path().to_path_buf(),
        config: n0_dir.join("config"),
        first,
        node_args: vec![],
    };
    let endpoint = cluster.first.address.to_string();
    cluster.ctl_retry(&["--endpoints", &endpoint, "takeownership", "--accept-ca"])?;
    let (mut m1, id1) = encrypted_node(&cluster, "m1", &imgs[1])?;
    let (mut m2, id2) = encrypted_node(&cluster, "m2", &imgs[2])?;
    for id in [&id1, &id2] {
        cluster.ctl_retry(&["node", "add-role", id, "ConsensusMember"])?;
    }
    cluster.wait_members(&endpoints(&[&cluster.first, &m1, &m2]), 3, 0)?;
    // Each member's half is kept by the others before the lights go out.
    let esp0 = cluster.first.root.join("esp");
    wait_until(
        "the first node's half is kept by another member",
        TIMEOUT,
        || !esp0.join("data-cluster-half").exists(),
    )?;
    for n in [&cluster.first, &m1, &m2] {
        let peers = n.root.join("esp/data-peers");
        wait_until("the member keeps two peer halves", TIMEOUT, || {
            std::fs::read(&peers).is_ok_and(|b| b.len() > 2 * 80)
        })?;
    }

    let acked = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let client = owner_client(&cluster, &[&cluster.first, &m1, &m2])?;
    let writer = start_writer(client, id1.clone(), 400, acked.clone(), stop.clone());
    wait_until("20 acknowledged writes", TIMEOUT, || {
        acked.lock().expect("ledger lock").len() >= 20
    })?;
    for n in [&mut cluster.first, &mut m1, &mut m2] {
        n.proc().signal(libc::SIGKILL);
    }
    for n in [&mut cluster.first, &mut m1, &mut m2] {
        n.proc().wait_exit(TIMEOUT)?;
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().expect("the writer panicked")?;
    let acked = acked.lock().expect("ledger lock").clone();

    for (n, img) in [
        (&mut cluster.first, &imgs[0]),
        (&mut m1, &imgs[1]),
        (&mut m2, &imgs[2]),
    ] {
        n.start(&["--data-device", img])?;
    }
    for n in [&mut cluster.first, &mut m1, &mut m2] {
        n.wait_home()?;
    }
    let out = cluster.ctl_retry(&[
        "--endpoints",
        &endpoints(&[&cluster.first, &m1, &m2]),
        "node",
        "describe",
        &id1,
        "-o",
        "json",
    ])?;
    let lost: Vec<&String> = acked
        .iter()
        .filter(|k| !out.contains(&format!("\"{k}\"")))
        .collect();
    ensure!(
        lost.is_empty(),
        "{} of {} acknowledged writes lost: {lost:?}",
        lost.len(),
        acked.len()
    );
    println!("{} acknowledged writes, none lost", acked.len());
    Ok(())
}
