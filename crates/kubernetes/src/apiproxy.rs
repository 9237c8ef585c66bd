//! A TCP forwarder to the controllers' apiservers: each connection accepted is joined to
//! the first apiserver that accepts within a bound (TLS passes through untouched: the
//! client authenticates to the apiserver itself). A worker's kubelet reaches the API
//! through one on its own loopback; `polisctl kubernetes proxy` is one for people. So
//! either keeps working while any one controller is down, without a shared address.
//!
//! ```text
//!   listen ──accept (≤ MAX_CONNECTIONS at once; more are dropped)──▶ targets, in order:
//!     connect ≤ CONNECT_BOUND each ─▶ the first that accepts ─▶ bytes both ways
//! ```

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long one apiserver gets to accept a connection before the next is tried.
pub const CONNECT_BOUND: Duration = Duration::from_millis(1000);
/// The most connections held at once.
pub const MAX_CONNECTIONS: usize = 256;

/// The apiservers connections go to, in the order they are tried; replaced live.
pub type Targets = Arc<Mutex<Vec<SocketAddr>>>;

/// Serves `listener` until the future is dropped.
pub async fn serve(listener: tokio::net::TcpListener, targets: Targets) -> std::io::Result<()> {
    let seats = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (client, _) = listener.accept().await?;
        let _ = client.set_nodelay(true);
        let Ok(seat) = seats.clone().try_acquire_owned() else {
            continue; // dropped: over the bound
        };
        let list = targets.lock().expect("apiserver targets lock").clone();
        tokio::spawn(async move {
            let _seat = seat;
            forward(client, &list).await;
        });
    }
}

/// Joins `client` to the first of `targets` that accepts within the bound.
pub async fn forward(mut client: tokio::net::TcpStream, targets: &[SocketAddr]) {
    for target in targets {
        if let Ok(Ok(mut upstream)) =
            tokio::time::timeout(CONNECT_BOUND, tokio::net::TcpStream::connect(target)).await
        {
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_connection_goes_to_the_first_target_that_accepts() {
        // A closed port first (bound, then dropped), then an echo server.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_address = closed.local_addr().unwrap();
        drop(closed);
        let echo = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_address = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 5];
            s.read_exact(&mut buf).await.unwrap();
            s.write_all(&buf).await.unwrap();
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let front = listener.local_addr().unwrap();
        let targets: Targets = Arc::new(Mutex::new(vec![closed_address, echo_address]));
        tokio::spawn(serve(listener, targets));
        let mut client = tokio::net::TcpStream::connect(front).await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let mut back = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&back, b"hello");
    }
}
