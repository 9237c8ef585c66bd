//! A gauge family replaced as a whole ([`GaugeSnapshot::replace`]) and encoded at scrape
//! time: for values computed together (nodes by state and health, heartbeat ages), so a
//! scrape never sees half of an update and series of vanished nodes disappear.
//!
//! Holds values only; may not compute them.

use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

/// One series: its labels and value.
pub type Series = (Vec<(&'static str, String)>, f64);

#[derive(Debug)]
pub struct GaugeSnapshot {
    name: &'static str,
    help: &'static str,
    series: Mutex<Vec<Series>>,
}

impl GaugeSnapshot {
    pub const fn new(name: &'static str, help: &'static str) -> GaugeSnapshot {
        GaugeSnapshot {
            name,
            help,
            series: Mutex::new(Vec::new()),
        }
    }

    /// Replaces every series (an empty list: the family is not exported).
    pub fn replace(&self, series: Vec<Series>) {
        *self.series.lock().expect("gauge snapshot lock") = series;
    }
}

impl Collector for GaugeSnapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let series = self.series.lock().expect("gauge snapshot lock");
        if series.is_empty() {
            return Ok(());
        }
        let mut family =
            encoder.encode_descriptor(self.name, self.help, None, MetricType::Gauge)?;
        for (labels, value) in series.iter() {
            ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}
