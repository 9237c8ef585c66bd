//! `polisctl`: the operator's command line for Polis clusters.
//!
//! The config directory (`--config`, default `~/.config/polis`) holds the operator's
//! credentials: the owner key, the owner certificate, the pinned cluster CA, the newest
//! CRL and the remembered curator endpoints (the file layout: `config_dir`).
//! `owner.pem` is renewed before any command once 2/3 of its lifetime have passed (or it
//! expired): AAA.Escrow with the owner key returns a new one, saved atomically.
//! `endpoints` is written by `takeownership` and refreshed whenever polisctl reads the
//! cluster's information (`cluster info`, `params register`); `--endpoints` overrides it.
//! Every call to a curator is mutual TLS: the curator's certificate must chain to the
//! pinned CA; polisctl presents its owner certificate (or, to take ownership, a
//! self-signed certificate proving the owner key).
//! Invariants: the directory is 0700 and every file in it 0600, written atomically; a key
//! file readable by others is refused, as ssh does.
//!
//! Modules, in layers; a module imports only from the layers below it:
//! ```text
//!   main            parses (cli) and dispatches: one call per command, nothing else
//!   ─────────────────────────────────────────────────────────────────────────────────
//!   commands::launch       a local cluster; runs the other commands as steps
//!   commands::dashboard    the live view: follows the audit log, fetches nodes and
//!                          the consensus status (commands::{node, status}), draws
//!   commands::{params, cluster, node, decommission, certificates, ca, status, owner,
//!              backup, snapshots, tickets, operators}
//!                          one module per command group: arguments → calls → render
//!   ─────────────────────────────────────────────────────────────────────────────────
//!   trust           takeownership: first contact, CA approval, first owner certificate
//!   render::{node, certificates, status, cluster, backup, snapshots, tickets,
//!           dashboard, versions, operators}
//!                   results as table / JSON / YAML (no calls, no files)
//!   ─────────────────────────────────────────────────────────────────────────────────
//!   session         the owner session: Management calls following the leader, CRL
//!                   refresh, owner certificate renewal (session::escrow), one-line
//!                   errors (session::errors)
//!   ─────────────────────────────────────────────────────────────────────────────────
//!   config_dir      the files in the config directory          ┐
//!   output          Format, YAML, tables, UTC times, escaping  │ leaves: pure or
//!   names           node state / health names, both ways      │ files only
//!   consensus_summary  etcd members' answers → members, quorum ┘
//!   cli             clap definitions and argument parsers (uses output::Format)
//! ```

mod cli;
mod commands;
mod config_dir;
mod consensus_summary;
mod names;
mod output;
mod render;
mod session;
mod trust;

use std::process::ExitCode;

use anyhow::Result;
use clap::{CommandFactory, Parser};

use cli::{
    BackupCommand, Cli, ClusterCommand, Command, ConfigCommand, KubernetesCommand, NodeCommand,
    OperatorCommand, OwnerCommand, ParamsCommand, TicketCommand,
};
use commands::{
    audit, backup, ca, certificates, cluster, dashboard, decommission, launch, logs, node,
    operators, owner, params, snapshots, status, tickets,
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("polisctl: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run_following_handovers(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The error may quote a server's message: shown, never obeyed.
            eprintln!("polisctl: {}", output::escape_text(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

/// [`run`]; when every curator refused the pinned CA and the CA pinned handed over to
/// the one they present (a rotation this configuration missed), pinned anew and run
/// again: nothing reached a curator the first time (every TLS handshake failed).
async fn run_following_handovers(cli: &Cli) -> Result<()> {
    let failure = match run(cli).await {
        Err(e) if session::pinned_ca_unknown(&e) => e,
        other => return other,
    };
    let followed = match cli.config_dir() {
        Ok(config) => trust::follow_handover(&config, &cli.endpoints).await,
        Err(e) => Err(e),
    };
    match followed {
        Ok(true) => run(cli).await,
        Ok(false) => Err(failure),
        Err(e) => {
            eprintln!(
                "polisctl: looking for a CA handover: {}",
                output::escape_text(&format!("{e:#}"))
            );
            Err(failure)
        }
    }
}

async fn run(cli: &Cli) -> Result<()> {
    match &cli.command {
        Command::Takeownership {
            accept_ca,
            ca_fingerprint,
        } => {
            let config = cli.config_dir()?;
            let trust = if *accept_ca {
                trust::CaApproval::Accept
            } else if let Some(f) = ca_fingerprint {
                trust::CaApproval::Fingerprint(f.clone())
            } else {
                trust::CaApproval::Ask
            };
            trust::take_ownership(&config, &cli.endpoints, trust).await
        }
        Command::Cluster(ClusterCommand::Info) => {
            let config = cli.config_dir()?;
            cluster::cluster_info(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Launch {
            dir,
            nodes,
            first_address,
            stop,
            node_binary,
            encrypted,
            kubernetes,
        }) => {
            if *stop {
                launch::stop(dir, false)
            } else {
                launch::launch(
                    dir,
                    *nodes,
                    *first_address,
                    node_binary.as_deref(),
                    *encrypted,
                    *kubernetes,
                )
                .await
            }
        }
        Command::Kubernetes(KubernetesCommand::Credentials { out, lifetime, via }) => {
            let config = cli.config_dir()?;
            commands::kubernetes::credentials(
                &config,
                &cli.endpoints,
                out,
                lifetime.map(std::time::Duration::from_secs),
                *via,
            )
            .await
        }
        Command::Kubernetes(KubernetesCommand::Proxy { listen }) => {
            let config = cli.config_dir()?;
            commands::kubernetes::proxy(&config, &cli.endpoints, *listen).await
        }
        Command::Cluster(ClusterCommand::Destroy { dir }) => launch::stop(dir, true),
        Command::Cluster(ClusterCommand::Versions) => {
            let config = cli.config_dir()?;
            let nodes = node::list_nodes(&config, &cli.endpoints).await?;
            let report = render::versions::report(&nodes);
            render::versions::print_report(&report, cli.output);
            if !report.blockers.is_empty() {
                anyhow::bail!(
                    "an upgrade step may not start: {}",
                    report.blockers.join("; ")
                );
            }
            Ok(())
        }
        Command::Cluster(ClusterCommand::Status) => {
            let config = cli.config_dir()?;
            status::cluster_status(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::RotateCa { force, etcd_peer }) => {
            let config = cli.config_dir()?;
            ca::rotate(&config, &cli.endpoints, *force, *etcd_peer, cli.output).await
        }
        Command::Cluster(ClusterCommand::Ca { etcd_peer }) => {
            let config = cli.config_dir()?;
            ca::show(&config, &cli.endpoints, *etcd_peer, cli.output).await
        }
        Command::Cluster(ClusterCommand::Certificates) => {
            let config = cli.config_dir()?;
            certificates::certificates(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Backup(args)) => match (&args.command, &args.out) {
            (Some(BackupCommand::Inspect { file }), _) => backup::inspect(file, cli.output),
            (None, Some(out)) => {
                let config = cli.config_dir()?;
                match (&args.from_node, &args.name) {
                    (Some(node), Some(name)) => {
                        snapshots::fetch(&config, &cli.endpoints, node, name, out, cli.output).await
                    }
                    _ => backup::save(&config, &cli.endpoints, out, cli.output).await,
                }
            }
            (None, None) => anyhow::bail!("cluster backup needs --out FILE (or `inspect FILE`)"),
        },
        Command::Cluster(ClusterCommand::Backups) => {
            let config = cli.config_dir()?;
            snapshots::list(&config, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Config(args)) => {
            let config = cli.config_dir()?;
            match &args.command {
                None => snapshots::show_config(&config, &cli.endpoints, cli.output).await,
                Some(ConfigCommand::Set {
                    snapshot_interval,
                    snapshot_keep,
                }) => {
                    snapshots::set_schedule(
                        &config,
                        &cli.endpoints,
                        *snapshot_interval,
                        *snapshot_keep,
                        cli.output,
                    )
                    .await
                }
            }
        }
        Command::Cluster(ClusterCommand::Audit {
            follow,
            node,
            since,
        }) => {
            let config = cli.config_dir()?;
            audit::audit(
                &config,
                &cli.endpoints,
                *follow,
                node.as_deref(),
                *since,
                cli.output,
            )
            .await
        }
        Command::Cluster(ClusterCommand::RotateTicket) => {
            let config = cli.config_dir()?;
            cluster::rotate_ticket(&config, &cli.endpoints).await
        }
        Command::Cluster(ClusterCommand::Tickets) => {
            tickets::list(&cli.config_dir()?, &cli.endpoints, cli.output).await
        }
        Command::Cluster(ClusterCommand::Ticket(TicketCommand::Revoke { id })) => {
            tickets::revoke(&cli.config_dir()?, &cli.endpoints, id).await
        }
        Command::Key { out } => operators::key(&cli.config_dir()?, out.as_deref()),
        Command::Cluster(ClusterCommand::Operator(command)) => {
            let config = cli.config_dir()?;
            match command {
                OperatorCommand::Add {
                    name,
                    role,
                    key_file,
                } => operators::add(&config, &cli.endpoints, name, role, key_file).await,
                OperatorCommand::List => operators::list(&config, &cli.endpoints, cli.output).await,
                OperatorCommand::Remove { name } => {
                    operators::remove(&config, &cli.endpoints, name).await
                }
            }
        }
        Command::Cluster(ClusterCommand::Owner(OwnerCommand::Rotate)) => {
            let config = cli.config_dir()?;
            owner::rotate(&config, &cli.endpoints).await
        }
        Command::Node(command) => {
            let config = cli.config_dir()?;
            match command {
                NodeCommand::List {
                    state,
                    role,
                    labels,
                } => {
                    node::node_list(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        state.as_deref(),
                        role.as_deref(),
                        labels,
                    )
                    .await
                }
                NodeCommand::Logs {
                    id,
                    follow,
                    lines,
                    runnable,
                    since,
                } => {
                    let args = logs::LogsArgs {
                        id,
                        follow: *follow,
                        lines: *lines,
                        runnable: runnable.as_deref(),
                        since_seconds: *since,
                    };
                    logs::logs(&config, &cli.endpoints, args, cli.output).await
                }
                NodeCommand::Describe { id } => {
                    node::node_describe(&config, &cli.endpoints, cli.output, id).await
                }
                NodeCommand::AddRole { id, role } => {
                    node::node_roles(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        id,
                        vec![role.clone()],
                        vec![],
                    )
                    .await
                }
                NodeCommand::RemoveRole { id, role } => {
                    node::node_roles(
                        &config,
                        &cli.endpoints,
                        cli.output,
                        id,
                        vec![],
                        vec![role.clone()],
                    )
                    .await
                }
                NodeCommand::Approve { ids, all_new } => {
                    node::node_approve(&config, &cli.endpoints, ids, *all_new).await
                }
                NodeCommand::Decommission {
                    ids,
                    no_wait,
                    timeout,
                } => {
                    let wait = (!no_wait).then(|| std::time::Duration::from_secs(*timeout));
                    decommission::node_decommission(&config, &cli.endpoints, ids, wait).await
                }
                NodeCommand::Delete { ids } => {
                    decommission::node_delete(&config, &cli.endpoints, ids).await
                }
                NodeCommand::UpgradeCheck { id } => {
                    let nodes = node::list_nodes(&config, &cli.endpoints).await?;
                    let reasons = render::versions::upgrade_check(&nodes, id);
                    if !reasons.is_empty() {
                        anyhow::bail!(
                            "node {} may not be upgraded now: {}",
                            output::escape(id),
                            reasons.join("; ")
                        );
                    }
                    if cli.output != output::Format::Quiet {
                        println!(
                            "node {} may be upgraded now (restart it, then wait until `cluster versions` shows it HEALTHY on the new version)",
                            output::escape(id)
                        );
                    }
                    Ok(())
                }
                NodeCommand::Label { id, changes } => {
                    node::node_label(&config, &cli.endpoints, cli.output, id, changes).await
                }
            }
        }
        Command::Dashboard => {
            let config = cli.config_dir()?;
            dashboard::dashboard(&config, &cli.endpoints).await
        }
        Command::Completion { shell } => {
            clap_complete::generate(
                *shell,
                &mut Cli::command(),
                "polisctl",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        Command::Params(ParamsCommand::Bootstrap {
            out,
            cluster_domain,
            labels,
            node_certificate_lifetime,
            owner_certificate_lifetime,
            etcd_quota,
            snapshot_interval,
            snapshot_keep,
            audit_max_entries,
            audit_max_bytes,
        }) => params::bootstrap(
            &cli.config_dir()?,
            out,
            labels,
            params::BootstrapSettings {
                cluster_domain,
                node_certificate_lifetime: *node_certificate_lifetime,
                owner_certificate_lifetime: *owner_certificate_lifetime,
                etcd_quota: *etcd_quota,
                snapshot_interval: *snapshot_interval,
                snapshot_keep: *snapshot_keep,
                audit_max_entries: *audit_max_entries,
                audit_max_bytes: *audit_max_bytes,
            },
        ),
        Command::Params(ParamsCommand::Register {
            out,
            labels,
            ttl,
            uses,
        }) => {
            let ticket = params::TicketSettings {
                ttl_seconds: *ttl,
                uses: *uses,
            };
            params::register(&cli.config_dir()?, &cli.endpoints, out, labels, ticket).await
        }
    }
}
