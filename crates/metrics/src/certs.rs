//! Seconds left on each certificate this node holds (`polis_certificate_expiry_seconds`
//! by certificate name), read from the DER or PEM files at each scrape so renewals show at once.
//!
//! Reads only the files it was given; a missing or unreadable file is left out of the
//! scrape (a worker has no etcd peer certificate), never an error.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// Seconds from `now` (Unix seconds) until the certificate in `file` (DER, or the first
/// of a PEM file) expires (negative once expired); `None` when it holds none.
pub fn seconds_left(file: &[u8], now: i64) -> Option<i64> {
    let not_after = match x509_parser::parse_x509_certificate(file) {
        Ok((_, cert)) => cert.validity().not_after.timestamp(),
        Err(_) => {
            let (_, block) = x509_parser::pem::parse_x509_pem(file).ok()?;
            block.parse_x509().ok()?.validity().not_after.timestamp()
        }
    };
    Some(not_after - now)
}

/// The certificates of one node: (name, PEM file).
#[derive(Debug, Clone)]
pub struct CertificateCollector {
    pub files: Vec<(&'static str, PathBuf)>,
}

impl Collector for CertificateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let left: Vec<(&'static str, i64)> = self
            .files
            .iter()
            .filter_map(|(name, path)| {
                Some((*name, seconds_left(&std::fs::read(path).ok()?, now)?))
            })
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            "polis_certificate_expiry_seconds",
            "Seconds until a certificate this node holds expires (negative once expired).",
            None,
            MetricType::Gauge,
        )?;
        for (name, seconds) in left {
            let labels = [("certificate", name)];
            ConstGauge::new(seconds).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_expiry_of_a_pem_certificate() {
        let mut params = rcgen::CertificateParams::new(vec!["x".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(2030, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        let now = 1_893_456_000 - 100; // 100 s before 2030-01-01T00:00:00Z
        let cert = params.self_signed(&key).unwrap();
        assert_eq!(seconds_left(pem.as_bytes(), now), Some(100));
        assert_eq!(seconds_left(cert.der(), now), Some(100));
        assert_eq!(seconds_left(b"not a certificate", now), None);
    }
}
