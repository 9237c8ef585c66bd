//! Streams that end when the certificate they were opened with expires: a follow of the
//! audit log, of a node's logs, a node's own record watch. The per-call check refuses an
//! expired certificate, but a stream opened a minute before the expiry would otherwise
//! stay open for as long as the connection does.
//!
//! A leaf: may not look at calls or connections.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_stream::Stream;
use tonic::Status;

use super::auth::ClientCertificate;

/// What a stream ends with at its certificate's expiry.
pub const STREAM_EXPIRED: &str = "the client certificate expired while the stream was open: the stream ends; renew the \
     certificate and open it again";

/// Longest single timer (tokio's timers reach about two years); a longer wait is
/// taken in steps.
const LONGEST_WAIT: Duration = Duration::from_secs(365 * 24 * 3600);

/// `inner`, ended with Unauthenticated ([`STREAM_EXPIRED`]) once `certificate` (the
/// caller's, when served here; none for a forwarded call, whose certificate the
/// forwarding curator checked) is past its `notAfter`.
pub fn ending_at_expiry<S>(inner: S, certificate: Option<&ClientCertificate>) -> Expiring<S> {
    let not_after = certificate
        .and_then(ClientCertificate::leaf)
        .and_then(|der| pki::Validity::of(der).ok())
        .map(|v| v.not_after);
    let mut expiring = Expiring {
        inner,
        not_after,
        timer: None,
        ended: false,
    };
    expiring.arm();
    expiring
}

/// See [`ending_at_expiry`].
pub struct Expiring<S> {
    inner: S,
    /// Unix seconds; none: the stream does not expire here.
    not_after: Option<u64>,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    ended: bool,
}

impl<S> Expiring<S> {
    /// Sets the timer for what is left before `not_after` (at most [`LONGEST_WAIT`]).
    fn arm(&mut self) {
        let Some(not_after) = self.not_after else {
            return;
        };
        let left =
            Duration::from_secs(not_after.saturating_sub(pki::unix_now())) + Duration::from_secs(1);
        self.timer = Some(Box::pin(tokio::time::sleep(left.min(LONGEST_WAIT))));
    }

    fn expired(&self) -> bool {
        self.not_after.is_some_and(|at| pki::unix_now() > at)
    }
}

impl<S, T> Stream for Expiring<S>
where
    S: Stream<Item = Result<T, Status>> + Unpin,
{
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        while let Some(timer) = self.timer.as_mut() {
            if timer.as_mut().poll(cx).is_pending() {
                break;
            }
            if self.expired() {
                self.ended = true;
                return Poll::Ready(Some(Err(Status::unauthenticated(STREAM_EXPIRED))));
            }
            // A step of a longer wait (or a clock that moved): wait for the rest.
            self.arm();
        }
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn a_stream_ends_once_its_certificate_expires_and_not_before() {
        let endless = || tokio_stream::pending::<Result<u32, Status>>();
        // Expired a second ago: the stream ends at its first poll.
        let mut expired = Expiring {
            inner: endless(),
            not_after: Some(pki::unix_now() - 1),
            timer: None,
            ended: false,
        };
        expired.arm();
        let ended = expired.next().await.expect("an answer").unwrap_err();
        assert_eq!(ended.code(), tonic::Code::Unauthenticated);
        assert_eq!(ended.message(), STREAM_EXPIRED);
        assert!(expired.next().await.is_none());
        // Valid for an hour: answers pass through, nothing ends it meanwhile.
        let mut valid = Expiring {
            inner: tokio_stream::iter([Ok(1), Ok(2)]),
            not_after: Some(pki::unix_now() + 3600),
            timer: None,
            ended: false,
        };
        valid.arm();
        let got: Vec<u32> = valid.map(|r| r.unwrap()).collect().await;
        assert_eq!(got, [1, 2]);
        // No certificate here (forwarded): never ends by itself.
        let plain = ending_at_expiry(tokio_stream::iter([Ok::<u32, Status>(7)]), None);
        assert!(plain.not_after.is_none() && plain.timer.is_none());
    }
}
