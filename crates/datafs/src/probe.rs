//! What a device holds, judged from its first bytes (pure logic; the caller reads them).
//!
//! Only a zeroed device is formatted without being told to; our own file system is
//! recognised by its ext4 superblock (magic, `encrypt` feature, label [`LABEL`]); anything
//! else is named as well as we can so the refusal says what would have been destroyed.

/// The ext4 volume label of a Polis data file system.
pub const LABEL: &str = "polis-data";
/// How many bytes from the start of a device [`classify`] wants to see.
pub const HEAD_LEN: usize = 1 << 20;

const SB: usize = 1024;
const EXT_MAGIC: u16 = 0xEF53;
const INCOMPAT_ENCRYPT: u32 = 0x10000;

/// What the first bytes of a device hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Only zeros: safe to format.
    Empty,
    /// An ext4 file system with encryption labelled [`LABEL`]: a Polis data file system.
    Ours,
    /// Something else, described for the refusal message.
    Other(String),
}

/// Classifies a device from its first bytes (up to [`HEAD_LEN`]; less for a smaller one).
pub fn classify(head: &[u8]) -> Content {
    if head.iter().all(|&b| b == 0) {
        return Content::Empty;
    }
    if let Some(sb) = head.get(SB..SB + 1024)
        && u16::from_le_bytes([sb[0x38], sb[0x39]]) == EXT_MAGIC
    {
        let incompat = u32::from_le_bytes(sb[0x60..0x64].try_into().expect("4 bytes"));
        let label_raw = &sb[0x78..0x88];
        let end = label_raw.iter().position(|&b| b == 0).unwrap_or(16);
        let label = String::from_utf8_lossy(&label_raw[..end]).into_owned();
        if label == LABEL && incompat & INCOMPAT_ENCRYPT != 0 {
            return Content::Ours;
        }
        return Content::Other(if label.is_empty() {
            "an ext2/3/4 file system without a label".to_string()
        } else {
            format!("an ext2/3/4 file system labelled {label:?}")
        });
    }
    let at = |off: usize, sig: &[u8]| head.get(off..off + sig.len()) == Some(sig);
    let what = if at(0, b"LUKS\xba\xbe") {
        "a LUKS encrypted volume"
    } else if at(0, b"XFSB") {
        "an XFS file system"
    } else if at(0x10040, b"_BHRfS_M") {
        "a Btrfs file system"
    } else if at(4086, b"SWAPSPACE2") || at(4086, b"SWAP-SPACE") {
        "swap space"
    } else if at(512, b"EFI PART") {
        "a GPT partition table"
    } else if at(510, b"\x55\xaa") {
        "an MBR partition table or boot sector"
    } else {
        "data of an unknown kind (not all zeros)"
    };
    Content::Other(what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext4(label: &str, incompat: u32) -> Vec<u8> {
        let mut head = vec![0u8; 8192];
        head[SB + 0x38..SB + 0x3a].copy_from_slice(&EXT_MAGIC.to_le_bytes());
        head[SB + 0x60..SB + 0x64].copy_from_slice(&incompat.to_le_bytes());
        head[SB + 0x78..SB + 0x78 + label.len()].copy_from_slice(label.as_bytes());
        head
    }

    #[test]
    fn zeros_are_empty() {
        assert_eq!(classify(&vec![0; HEAD_LEN]), Content::Empty);
        assert_eq!(classify(&[]), Content::Empty);
    }

    #[test]
    fn our_file_system_needs_label_and_encryption() {
        assert_eq!(
            classify(&ext4(LABEL, INCOMPAT_ENCRYPT | 0x2c2)),
            Content::Ours
        );
        assert_eq!(
            classify(&ext4(LABEL, 0x2c2)),
            Content::Other("an ext2/3/4 file system labelled \"polis-data\"".into())
        );
        assert_eq!(
            classify(&ext4("home", INCOMPAT_ENCRYPT)),
            Content::Other("an ext2/3/4 file system labelled \"home\"".into())
        );
        assert_eq!(
            classify(&ext4("", 0)),
            Content::Other("an ext2/3/4 file system without a label".into())
        );
    }

    #[test]
    fn other_content_is_named() {
        let mut head = vec![0u8; 8192];
        head[510] = 0x55;
        head[511] = 0xaa;
        assert_eq!(
            classify(&head),
            Content::Other("an MBR partition table or boot sector".into())
        );
        head[512..520].copy_from_slice(b"EFI PART");
        assert_eq!(
            classify(&head),
            Content::Other("a GPT partition table".into())
        );
        let mut head = vec![0u8; 8192];
        head[0..6].copy_from_slice(b"LUKS\xba\xbe");
        assert_eq!(
            classify(&head),
            Content::Other("a LUKS encrypted volume".into())
        );
        let mut head = vec![0u8; 8192];
        head[5000] = 1;
        assert_eq!(
            classify(&head),
            Content::Other("data of an unknown kind (not all zeros)".into())
        );
    }
}

/// Properties over arbitrary device heads (proptest): only zeros are ever formatted.
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn only_zeros_are_empty(
            head in prop::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..2200),
        ) {
            let zeros = head.iter().all(|&b| b == 0);
            prop_assert_eq!(classify(&head) == Content::Empty, zeros);
        }
    }
}
