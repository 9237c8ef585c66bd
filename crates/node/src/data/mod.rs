//! The data device (`--data-device`, issue 18): the node's `data/` on an encrypted file
//! system (`datafs`), unlocked before anything reads it: from the curators, or on a
//! consensus member's cold start from its peers. Its ESP files (`disk::datakeys`) lie
//! below, with the rest of the root.
//!
//! ```text
//!   datadev         the ESP's keys, DataUnlock (waits, Split), the encrypted data file
//!     │             system mounted on data/, closed at the end
//!     └──▶ datapeers    members' cold start: esp/data-peers, the :7837 unlock
//!                       listener, asking peers, the refresh loop (run by the control
//!                       plane)
//! ```

pub(crate) mod datadev;
pub(crate) mod datapeers;
