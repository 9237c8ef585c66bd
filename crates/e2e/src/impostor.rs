//! An impostor: a TLS server presenting someone else's certificate (a removed node's,
//! say) on the curator port, as someone posing as a curator would, to show that
//! clients refuse it.
//!
//! Uses no process; may not know about clusters.

use std::net::SocketAddr;

use anyhow::Result;

use crate::wait::TIMEOUT;

/// A TLS server presenting given credentials to whoever connects (it completes
/// handshakes and answers nothing), on a thread of its own.
pub struct Impostor {
    attempts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Impostor {
    /// Serves on `address` (bound at once) until dropped, or for [`TIMEOUT`] at most.
    pub fn serve(address: SocketAddr, credentials: rpc::Credentials) -> Result<Impostor> {
        let listener = std::net::TcpListener::bind(address)?;
        listener.set_nonblocking(true)?;
        let config = rpc::tls::server_config(&credentials)?;
        let attempts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let counter = attempts.clone();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let acceptor = tokio_rustls::TlsAcceptor::from(config);
                let serve = async {
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            return;
                        };
                        counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        let _ = acceptor.accept(tcp).await;
                    }
                };
                tokio::select! {
                    _ = serve => {}
                    _ = stopped => {}
                    _ = tokio::time::sleep(TIMEOUT) => {}
                }
            });
        });
        Ok(Impostor {
            attempts,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// How many connections it accepted (proof that a client did dial it).
    pub fn handshakes_attempted(&self) -> usize {
        self.attempts.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Impostor {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
