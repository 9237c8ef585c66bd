//! The node's root on disk: its layout, lock, atomic writes and protobuf files
//! (`storage`), the node's own files by content (`files`), and the ESP files of an
//! encrypted data device (`datakeys`). The rooms above read and write the root through
//! here (but for the log file, `logs::logfile`); it imports nothing else of this crate.
//!
//! ```text
//!   files           peer files, PEM, node key, directory, member.pb, quota.pb
//!   datakeys        ESP files of a data device: local half, join key, pending cluster
//!     │             half, the trust and CRL copies; ROOT/datafs
//!     └──▶ storage      root layout, lock, atomic writes, protobuf files
//! ```

pub(crate) mod datakeys;
pub(crate) mod files;
pub(crate) mod storage;
