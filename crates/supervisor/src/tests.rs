use super::*;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

fn fast() -> Config {
    Config {
        backoff: Backoff {
            initial: Duration::from_millis(10),
            max: Duration::from_millis(50),
            multiplier: 2.0,
        },
        on_restart: None,
    }
}

/// Polls `cond` until it holds; panics with `what` after a generous timeout.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn state(s: &Supervisor, dn: &str) -> Option<RunnableState> {
    s.status(dn).map(|st| st.state)
}

#[test]
fn backoff_grows_and_caps() {
    let b = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_millis(1000),
        multiplier: 2.0,
    };
    let cases = [
        (0, 100),
        (1, 200),
        (2, 400),
        (3, 800),
        (4, 1000),
        (200, 1000),
    ];
    for (attempt, ms) in cases {
        assert_eq!(
            b.delay(attempt),
            Duration::from_millis(ms),
            "attempt {attempt}"
        );
    }
}

#[test]
fn names_are_validated() {
    for ok in ["a", "etcd", "control_plane", "cluster-manager", "x9"] {
        assert_eq!(validate_name(ok), Ok(()), "{ok}");
    }
    for bad in ["", "Upper", "a.b", "sp ace", &"x".repeat(65)] {
        assert!(validate_name(bad).is_err(), "{bad}");
    }
}

#[tokio::test]
async fn children_get_dotted_names_and_healthy_state() {
    let sup = Supervisor::start(fast(), |ctx: Context| async move {
        ctx.run("consensus", |ctx: Context| async move {
            ctx.run("etcd", |ctx: Context| async move {
                ctx.signal_healthy();
                ctx.cancelled().await;
                Ok(())
            })?;
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        })?;
        ctx.signal_healthy();
        ctx.cancelled().await;
        Ok(())
    });
    eventually("etcd healthy", || {
        state(&sup, "root.consensus.etcd") == Some(RunnableState::Healthy)
    })
    .await;
    let dump = sup.dump();
    assert!(dump.contains("root.consensus.etcd"), "{dump}");
    assert!(dump.contains("HEALTHY"), "{dump}");
    sup.shutdown().await;
}

#[tokio::test]
async fn duplicate_child_names_are_refused() {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let tx = Mutex::new(Some(tx));
    let sup = Supervisor::start(fast(), move |ctx: Context| {
        let tx = tx.lock().unwrap().take();
        async move {
            let child = |ctx: Context| async move {
                ctx.cancelled().await;
                Ok(())
            };
            ctx.run("a", child)?;
            let second = ctx.run("a", child);
            if let Some(tx) = tx {
                let _ = tx.send(second);
            }
            ctx.cancelled().await;
            Ok(())
        }
    });
    let second = rx.await.unwrap();
    assert_eq!(
        second,
        Err(SupervisorError::DuplicateName {
            dn: "root.a".into()
        })
    );
    sup.shutdown().await;
}

#[tokio::test]
async fn restart_hook_hears_every_restart_by_dn() {
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let h = heard.clone();
    let config = Config {
        on_restart: Some(Arc::new(move |dn: &str| {
            h.lock().unwrap().push(dn.to_string())
        })),
        ..fast()
    };
    let sup = Supervisor::start(config, move |ctx: Context| async move {
        ctx.run("flaky", |_ctx: Context| async { Err("always".into()) })?;
        ctx.run("steady", |ctx: Context| async move {
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        })?;
        ctx.signal_healthy();
        ctx.cancelled().await;
        Ok(())
    });
    eventually("three restarts heard", || heard.lock().unwrap().len() >= 3).await;
    let restarts = sup.status("root.flaky").unwrap().restarts as usize;
    sup.shutdown().await;
    let heard = heard.lock().unwrap();
    assert!(heard.iter().all(|dn| dn == "root.flaky"), "{heard:?}");
    assert!(
        heard.len() >= restarts,
        "{} heard, {restarts} restarts",
        heard.len()
    );
}

#[tokio::test]
async fn failing_runnable_is_restarted_with_backoff() {
    let starts = Arc::new(AtomicU32::new(0));
    let s = starts.clone();
    let sup = Supervisor::start(fast(), move |ctx: Context| {
        let s = s.clone();
        async move {
            ctx.run("flaky", move |_ctx: Context| {
                let n = s.fetch_add(1, Ordering::SeqCst);
                async move { Err(format!("failure number {n}").into()) }
            })?;
            ctx.cancelled().await;
            Ok(())
        }
    });
    eventually("three restarts", || starts.load(Ordering::SeqCst) >= 4).await;
    let status = sup.status("root.flaky").unwrap();
    assert!(status.restarts >= 3, "{status:?}");
    sup.shutdown().await;
}

fn growing() -> Config {
    Config {
        backoff: Backoff {
            initial: Duration::from_millis(5),
            max: Duration::from_secs(60),
            multiplier: 2.0,
        },
        on_restart: None,
    }
}

#[tokio::test]
async fn backoff_grows_while_failing_without_healthy() {
    let sup = Supervisor::start(growing(), |ctx: Context| async move {
        ctx.run("flaky", |_ctx: Context| async { Err("always".into()) })?;
        ctx.cancelled().await;
        Ok(())
    });
    eventually("four restarts", || {
        sup.status("root.flaky").is_some_and(|s| s.restarts >= 4)
    })
    .await;
    // 5, 10, 20, 40, 80 ms …: the delay doubles with every failure.
    let status = sup.status("root.flaky").unwrap();
    assert!(
        status.last_backoff >= Duration::from_millis(40),
        "{status:?}"
    );
    sup.shutdown().await;
}

#[tokio::test]
async fn backoff_resets_after_healthy() {
    let sup = Supervisor::start(growing(), |ctx: Context| async move {
        ctx.run("recovering", |ctx: Context| async move {
            ctx.signal_healthy();
            Err("fails after coming up".into())
        })?;
        ctx.cancelled().await;
        Ok(())
    });
    eventually("four restarts", || {
        sup.status("root.recovering")
            .is_some_and(|s| s.restarts >= 4)
    })
    .await;
    let status = sup.status("root.recovering").unwrap();
    assert_eq!(status.last_backoff, Duration::from_millis(5), "{status:?}");
    sup.shutdown().await;
}

#[tokio::test]
async fn panicking_runnable_is_restarted() {
    let starts = Arc::new(AtomicU32::new(0));
    let s = starts.clone();
    let sup = Supervisor::start(fast(), move |ctx: Context| {
        let s = s.clone();
        async move {
            ctx.run("panicky", move |ctx: Context| {
                let n = s.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        panic!("first start panics");
                    }
                    ctx.signal_healthy();
                    ctx.cancelled().await;
                    Ok(())
                }
            })?;
            ctx.cancelled().await;
            Ok(())
        }
    });
    eventually("healthy after panic", || {
        state(&sup, "root.panicky") == Some(RunnableState::Healthy)
    })
    .await;
    assert_eq!(starts.load(Ordering::SeqCst), 2);
    assert_eq!(sup.status("root.panicky").unwrap().restarts, 1);
    sup.shutdown().await;
}

#[tokio::test]
async fn returning_without_done_counts_as_failure() {
    let sup = Supervisor::start(fast(), |ctx: Context| async move {
        ctx.run("quitter", |_ctx: Context| async move { Ok(()) })?;
        ctx.cancelled().await;
        Ok(())
    });
    eventually("quitter restarted", || {
        sup.status("root.quitter").is_some_and(|s| s.restarts >= 1)
    })
    .await;
    sup.shutdown().await;
}

#[tokio::test]
async fn parent_failure_restarts_its_subtree() {
    let child_starts = Arc::new(AtomicU32::new(0));
    let child_cancels = Arc::new(AtomicU32::new(0));
    let parent_starts = Arc::new(AtomicU32::new(0));
    let (cs, cc, ps) = (
        child_starts.clone(),
        child_cancels.clone(),
        parent_starts.clone(),
    );
    let sup = Supervisor::start(fast(), move |ctx: Context| {
        let (cs, cc, ps) = (cs.clone(), cc.clone(), ps.clone());
        async move {
            ctx.run("parent", move |ctx: Context| {
                let (cs, cc) = (cs.clone(), cc.clone());
                let n = ps.fetch_add(1, Ordering::SeqCst);
                async move {
                    ctx.run("child", move |ctx: Context| {
                        cs.fetch_add(1, Ordering::SeqCst);
                        let cc = cc.clone();
                        async move {
                            ctx.signal_healthy();
                            ctx.cancelled().await;
                            cc.fetch_add(1, Ordering::SeqCst);
                            Ok(())
                        }
                    })?;
                    ctx.signal_healthy();
                    if n == 0 {
                        // Let the child come up, then die: the child must go with us.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        return Err("parent fails once".into());
                    }
                    ctx.cancelled().await;
                    Ok(())
                }
            })?;
            ctx.cancelled().await;
            Ok(())
        }
    });
    eventually("child restarted with parent", || {
        child_starts.load(Ordering::SeqCst) == 2
            && state(&sup, "root.parent.child") == Some(RunnableState::Healthy)
    })
    .await;
    assert_eq!(child_cancels.load(Ordering::SeqCst), 1);
    assert_eq!(parent_starts.load(Ordering::SeqCst), 2);
    sup.shutdown().await;
}

#[tokio::test]
async fn shutdown_cancels_all_descendants() {
    let cancelled = Arc::new(AtomicU32::new(0));
    let c = cancelled.clone();
    let sup = Supervisor::start(fast(), move |ctx: Context| {
        let c = c.clone();
        async move {
            for name in ["a", "b"] {
                let c = c.clone();
                ctx.run(name, move |ctx: Context| {
                    let c = c.clone();
                    async move {
                        let c2 = c.clone();
                        ctx.run("leaf", move |ctx: Context| {
                            let c = c2.clone();
                            async move {
                                ctx.signal_healthy();
                                ctx.cancelled().await;
                                c.fetch_add(1, Ordering::SeqCst);
                                Ok(())
                            }
                        })?;
                        ctx.signal_healthy();
                        ctx.cancelled().await;
                        c.fetch_add(1, Ordering::SeqCst);
                        Ok(())
                    }
                })?;
            }
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        }
    });
    eventually("leaves healthy", || {
        state(&sup, "root.a.leaf") == Some(RunnableState::Healthy)
            && state(&sup, "root.b.leaf") == Some(RunnableState::Healthy)
    })
    .await;
    let tree = sup.tree.clone();
    sup.shutdown().await;
    assert_eq!(cancelled.load(Ordering::SeqCst), 4);
    let nodes = tree.nodes.lock().unwrap();
    for dn in ["root", "root.a", "root.b", "root.a.leaf", "root.b.leaf"] {
        assert_eq!(nodes[dn].state, RunnableState::Canceled, "{dn}");
    }
}

#[tokio::test]
async fn done_runnable_stays_done_and_keeps_children() {
    let sup = Supervisor::start(fast(), |ctx: Context| async move {
        ctx.run("oneshot", |ctx: Context| async move {
            ctx.run("worker", |ctx: Context| async move {
                ctx.signal_healthy();
                ctx.cancelled().await;
                Ok(())
            })?;
            ctx.signal_done();
            Ok(())
        })?;
        ctx.cancelled().await;
        Ok(())
    });
    eventually("oneshot done, worker healthy", || {
        state(&sup, "root.oneshot") == Some(RunnableState::Done)
            && state(&sup, "root.oneshot.worker") == Some(RunnableState::Healthy)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(sup.status("root.oneshot").unwrap().restarts, 0);
    sup.shutdown().await;
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn every_log_line_carries_the_runnable_name() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let sup = Supervisor::start(fast(), |ctx: Context| async move {
            ctx.run("logger", |ctx: Context| async move {
                tracing::info!("hello from the child");
                ctx.signal_done();
                Ok(())
            })?;
            ctx.run("failer", |ctx: Context| async move {
                if ctx.is_cancelled() {
                    return Ok(());
                }
                Err("deliberate".into())
            })?;
            ctx.cancelled().await;
            Ok(())
        });
        eventually("failer restarted", || {
            sup.status("root.failer").is_some_and(|s| s.restarts >= 1)
        })
        .await;
        sup.shutdown().await;
    });
    let out = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let hello = out
        .lines()
        .find(|l| l.contains("hello from the child"))
        .unwrap();
    assert!(hello.contains("dn=root.logger"), "{hello}");
    let failure = out.lines().find(|l| l.contains("deliberate")).unwrap();
    assert!(failure.contains("dn=root.failer"), "{failure}");
}

#[tokio::test]
async fn a_stoppable_child_stops_on_purpose_with_its_subtree_and_is_not_restarted() {
    let starts = Arc::new(AtomicU32::new(0));
    let grandchild_exits = Arc::new(AtomicU32::new(0));
    let (handles_tx, mut handles_rx) = tokio::sync::mpsc::unbounded_channel();
    let (s2, g2) = (starts.clone(), grandchild_exits.clone());
    let sup = Supervisor::start(fast(), move |ctx| {
        let (starts, grandchild_exits, handles) = (s2.clone(), g2.clone(), handles_tx.clone());
        async move {
            let start_child = || {
                let (starts, grandchild_exits) = (starts.clone(), grandchild_exits.clone());
                ctx.run_stoppable("plane", move |ctx| {
                    starts.fetch_add(1, Ordering::SeqCst);
                    let grandchild_exits = grandchild_exits.clone();
                    async move {
                        ctx.run("inner", move |ctx| {
                            let exits = grandchild_exits.clone();
                            async move {
                                ctx.signal_healthy();
                                ctx.cancelled().await;
                                exits.fetch_add(1, Ordering::SeqCst);
                                Ok(())
                            }
                        })?;
                        ctx.signal_healthy();
                        ctx.cancelled().await;
                        Ok(())
                    }
                })
            };
            handles.send(start_child()?).expect("test alive");
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        }
    });
    let handle = handles_rx.recv().await.expect("a handle");
    eventually("plane and inner healthy", || {
        state(&sup, "root.plane.inner") == Some(RunnableState::Healthy)
    })
    .await;
    handle.stop().await;
    assert_eq!(grandchild_exits.load(Ordering::SeqCst), 1);
    assert_eq!(state(&sup, "root.plane"), None, "forgotten after stopping");
    assert_eq!(state(&sup, "root.plane.inner"), None);
    assert_eq!(state(&sup, "root"), Some(RunnableState::Healthy));
    // Not restarted: stopping is not a failure.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    sup.shutdown().await;
}

#[tokio::test]
async fn shutdown_within_names_a_runnable_that_ignores_its_cancellation() {
    let sup = Supervisor::start(fast(), |ctx: Context| async move {
        ctx.run("stubborn", |ctx: Context| async move {
            ctx.signal_healthy();
            std::future::pending::<()>().await;
            Ok(())
        })?;
        ctx.run("polite", |ctx: Context| async move {
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        })?;
        ctx.signal_healthy();
        ctx.cancelled().await;
        Ok(())
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !["root.stubborn", "root.polite"].iter().all(|dn| {
        sup.status(dn)
            .is_some_and(|s| s.state == RunnableState::Healthy)
    }) {
        assert!(tokio::time::Instant::now() < deadline, "{}", sup.dump());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stuck = sup.shutdown_within(Duration::from_millis(300)).await;
    assert!(stuck.contains(&"root.stubborn".to_string()), "{stuck:?}");
    assert!(!stuck.contains(&"root.polite".to_string()), "{stuck:?}");
}

#[tokio::test]
async fn shutdown_within_returns_nothing_when_every_runnable_stops() {
    let sup = Supervisor::start(fast(), |ctx: Context| async move {
        ctx.run("polite", |ctx: Context| async move {
            ctx.signal_healthy();
            ctx.cancelled().await;
            Ok(())
        })?;
        ctx.signal_healthy();
        ctx.cancelled().await;
        Ok(())
    });
    assert_eq!(
        sup.shutdown_within(Duration::from_secs(10)).await,
        Vec::<String>::new()
    );
}
