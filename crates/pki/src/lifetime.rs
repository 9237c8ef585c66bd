//! Certificate lifetimes: the defaults, the bounds every issued certificate must keep,
//! the clock-skew allowance ([`BACKDATE`]), and a certificate's [`Validity`] with its
//! renewal (2/3) and warning (5/6) points.
//!
//! A leaf: pure (reads a DER certificate's validity, no I/O); may not issue.

use std::time::Duration;

use crate::PkiError;

/// Lifetime of a CA certificate.
pub const CA_LIFETIME: Duration = Duration::from_secs(20 * 365 * 24 * 3600);
/// Default lifetime of node and etcd peer certificates.
pub const CERTIFICATE_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// Default lifetime of owner certificates.
pub const OWNER_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);

/// Shortest lifetime a certificate may be issued with. Holders renew at 2/3 of the
/// lifetime, so this leaves a renewal a few seconds: enough for tests on one machine,
/// never sensible in production (where lifetimes are days to a year).
pub const MIN_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(5);
/// Longest lifetime a certificate may be issued with: well inside the CAs' lifetime.
pub const MAX_CERTIFICATE_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Refuses certificate lifetimes outside [`MIN_CERTIFICATE_LIFETIME`] ..=
/// [`MAX_CERTIFICATE_LIFETIME`].
pub fn check_lifetime(lifetime: Duration) -> Result<(), PkiError> {
    if lifetime < MIN_CERTIFICATE_LIFETIME {
        return Err(PkiError::LifetimeTooShort {
            lifetime,
            minimum: MIN_CERTIFICATE_LIFETIME,
        });
    }
    if lifetime > MAX_CERTIFICATE_LIFETIME {
        return Err(PkiError::LifetimeTooLong {
            lifetime,
            maximum: MAX_CERTIFICATE_LIFETIME,
        });
    }
    Ok(())
}

/// When a certificate was issued and when it expires (seconds since the Unix epoch),
/// read from its validity: issued = `not_before + BACKDATE` (see [`BACKDATE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    pub not_before: u64,
    pub not_after: u64,
}

impl Validity {
    /// The validity of a DER certificate.
    pub fn of(cert_der: &[u8]) -> Result<Validity, PkiError> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(cert_der).map_err(|e| PkiError::Invalid {
                what: "certificate",
                reason: e.to_string(),
            })?;
        let v = cert.validity();
        let secs = |t: x509_parser::time::ASN1Time| u64::try_from(t.timestamp()).unwrap_or(0);
        Ok(Validity {
            not_before: secs(v.not_before),
            not_after: secs(v.not_after),
        })
    }

    /// When it was issued: its lifetime starts here.
    pub fn issued(&self) -> u64 {
        (self.not_before + BACKDATE.as_secs()).min(self.not_after)
    }

    pub fn lifetime(&self) -> u64 {
        self.not_after - self.issued()
    }

    /// The point `num/den` of the way through its lifetime.
    fn fraction(&self, num: u64, den: u64) -> u64 {
        self.issued() + self.lifetime() * num / den
    }

    /// When its holder renews it: once 2/3 of its lifetime have passed.
    pub fn renew_at(&self) -> u64 {
        self.fraction(2, 3)
    }

    /// From when a certificate that was not replaced yet deserves an operator's
    /// attention: 5/6 of its lifetime (half of the time its holder had to renew it
    /// has gone by without success).
    pub fn warn_at(&self) -> u64 {
        self.fraction(5, 6)
    }
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Tolerance for clocks that are slightly behind the issuer's: `not_before` lies this
/// much before the issue time, *outside* the lifetime, so a certificate is valid for its
/// whole lifetime from the moment it is issued.
pub const BACKDATE: Duration = Duration::from_secs(5 * 60);
