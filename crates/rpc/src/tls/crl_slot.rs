//! The newest cluster CRL a client has seen ([`CrlSlot`]): kept only when signed by the
//! cluster CA and not older than the one held.
//!
//! A leaf: may not build configurations.

use std::sync::{Arc, Mutex};

use crate::RpcError;

/// The newest cluster CRL a client has seen, shared by all its connections: a server
/// whose certificate it lists is refused at the handshake, so that a node removed from
/// the cluster cannot pose as a curator. CRLs are accepted only when signed by the
/// cluster CA and not older (by CRL number) than the one held, so it does not matter
/// which server delivered them.
#[derive(Debug, Clone, Default)]
pub struct CrlSlot(Arc<Mutex<Option<HeldCrl>>>);

/// A CRL (DER) and its CRL number.
type HeldCrl = (Vec<u8>, u64);

impl CrlSlot {
    pub fn new() -> CrlSlot {
        CrlSlot::default()
    }

    /// The CRL held (DER), if any.
    pub fn current(&self) -> Option<Vec<u8>> {
        self.0
            .lock()
            .expect("CRL slot lock poisoned")
            .as_ref()
            .map(|(der, _)| der.clone())
    }

    /// Offers `crl_der`: kept when signed by `ca_der` and at least as new as the CRL
    /// held. Returns whether it replaced that CRL (false: the same or an older one).
    pub fn offer(&self, ca_der: &[u8], crl_der: &[u8]) -> Result<bool, RpcError> {
        // The one held, offered again (every WatchNode update carries it): it was
        // verified when it was taken, against the same CA.
        if self
            .0
            .lock()
            .expect("CRL slot lock poisoned")
            .as_ref()
            .is_some_and(|(der, _)| der == crl_der)
        {
            return Ok(false);
        }
        let number = pki::verified_crl_number(crl_der, ca_der)
            .map_err(|e| RpcError::Certificate(format!("cluster CRL: {e}")))?;
        let mut held = self.0.lock().expect("CRL slot lock poisoned");
        match held.as_ref() {
            Some((der, n)) if *n > number || (*n == number && der == crl_der) => Ok(false),
            _ => {
                *held = Some((crl_der.to_vec(), number));
                Ok(true)
            }
        }
    }
}
