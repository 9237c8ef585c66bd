//! Clients to the local etcd: the unix-socket connection and per-user namespaces.

use std::path::Path;
use std::time::Duration;

use etcd_client::Client;

use crate::ConsensusError;

/// Connects to etcd over its unix socket. `etcd_client::Client::connect` cannot do this
/// (it prefixes `http://` and resolves through DNS), so we hand it a tonic channel.
pub async fn connect_unix(socket: &Path) -> Result<Client, ConsensusError> {
    let uri = format!("unix://{}", socket.display());
    let channel = tonic::transport::Endpoint::from_shared(uri)
        .map_err(|_| ConsensusError::SocketPathTooLong {
            path: socket.to_path_buf(),
        })?
        .connect_timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| ConsensusError::Connect {
            path: socket.to_path_buf(),
            reason: supervisor::error_chain(&e),
        })?;
    Ok(Client::from_channel(etcd_client::Channel::Tonic(channel), None).await?)
}

/// A view of etcd restricted to one consensus user's key prefix, `namespaced:<user>/`.
/// Users (curator, etcd-pki, …) never see each other's keys by accident.
#[derive(Clone)]
pub struct Namespaced {
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for Namespaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Namespaced")
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// The key prefix of a consensus user.
pub fn namespace_prefix(user: &str) -> String {
    format!("namespaced:{user}/")
}

impl Namespaced {
    pub fn new(client: Client, user: &str) -> Namespaced {
        Namespaced {
            client,
            prefix: namespace_prefix(user),
        }
    }

    /// A narrower namespace inside this one: `namespaced:curator/` + `cluster-pki/`.
    pub fn sub(&self, part: &str) -> Namespaced {
        Namespaced {
            client: self.client.clone(),
            prefix: format!("{}{part}/", self.prefix),
        }
    }

    /// The full etcd key for `key` in this namespace.
    pub fn key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The raw client, for transactions over keys built with [`Namespaced::key`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub async fn get(&self, key: &str) -> Result<Option<Vec<u8>>, ConsensusError> {
        let response = self.client.clone().get(self.key(key), None).await?;
        Ok(response.kvs().first().map(|kv| kv.value().to_vec()))
    }

    pub async fn put(&self, key: &str, value: Vec<u8>) -> Result<(), ConsensusError> {
        self.client.clone().put(self.key(key), value, None).await?;
        Ok(())
    }
}

/// The value of the first key a `get` inside a transaction returned, if any.
pub fn txn_get_value(response: Option<&etcd_client::TxnOpResponse>) -> Option<Vec<u8>> {
    match response {
        Some(etcd_client::TxnOpResponse::Get(get)) => {
            get.kvs().first().map(|kv| kv.value().to_vec())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(namespace_prefix("curator"), "namespaced:curator/");
    }
}
