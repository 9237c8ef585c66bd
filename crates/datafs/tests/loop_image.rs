//! Root tests with a real loop image: format, mount, write, unmount, remount, wrong key,
//! foreign devices, and a raw-image search for plaintext. Skipped (with a printed reason)
//! only where the kernel lacks ext4 encryption.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use datafs::{DataKey, Error, FormatPolicy, Half, Owner, Spec, mounts};

const IMAGE_LEN: u64 = 64 << 20;

/// An image file with the directories to mount it on; unmounts leftovers when dropped.
struct Image {
    dir: tempfile::TempDir,
}

impl Image {
    /// A new all-zero image, or `None` (with a printed reason) where the kernel lacks
    /// ext4 encryption.
    fn usable() -> Option<Image> {
        if !datafs::fscrypt::kernel_supports_ext4_encryption() {
            println!(
                "SKIPPED: this kernel lacks ext4 encryption (/sys/fs/ext4/features/encryption)"
            );
            return None;
        }
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "these tests need root (loop devices, mount)"
        );
        let dir = tempfile::tempdir().unwrap();
        let f = fs::File::create(dir.path().join("data.img")).unwrap();
        f.set_len(IMAGE_LEN).unwrap();
        Some(Image { dir })
    }
    fn path(&self) -> PathBuf {
        self.dir.path().join("data.img")
    }
    fn fs_dir(&self) -> PathBuf {
        self.dir.path().join("datafs")
    }
    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
    fn open(
        &self,
        owner: &Owner,
        key: &DataKey,
        format: FormatPolicy,
    ) -> Result<datafs::Volume, Error> {
        let (image, fs_dir, data_dir) = (self.path(), self.fs_dir(), self.data_dir());
        datafs::open(
            &Spec {
                device: &image,
                fs_dir: &fs_dir,
                data_dir: &data_dir,
                owner,
                format,
            },
            key,
        )
    }
    /// Opens it as node n1 of cluster-1 with its key.
    fn open_own(&self, format: FormatPolicy) -> Result<datafs::Volume, Error> {
        self.open(&owner("n1"), &key(1, 2), format)
    }
    /// Runs `mkfs.ext4 -q -F ARGS` on the image.
    fn mkfs(&self, args: &[&str]) {
        let out = std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F"])
            .args(args)
            .arg(self.path())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    /// Mounts the image as an attacker would, with no key added, on `DIR/raw`; returns
    /// that (the loop device detaches once it is unmounted).
    fn mount_raw(&self) -> PathBuf {
        let raw = self.dir.path().join("raw");
        fs::create_dir_all(&raw).unwrap();
        let dev = datafs::loopdev::attach(&self.path()).unwrap();
        mounts::mount(dev.path(), &raw, Some("ext4"), 0).unwrap();
        raw
    }
    fn bytes(&self) -> Vec<u8> {
        fs::read(self.path()).unwrap()
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        for d in [self.data_dir(), self.fs_dir(), self.dir.path().join("raw")] {
            while mounts::is_mount_point(&d).unwrap_or(false) {
                if mounts::unmount(&d).is_err() {
                    break;
                }
            }
        }
    }
}

fn owner(node: &str) -> Owner {
    Owner {
        cluster: "cluster-1".into(),
        node: node.into(),
    }
}

fn key(local: u8, cluster: u8) -> DataKey {
    DataKey::derive(
        &Half::from_bytes([local; 32]),
        &Half::from_bytes([cluster; 32]),
    )
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn formats_once_and_reads_back_after_remount() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert!(v.formatted());
    assert_eq!(v.data_dir(), img.data_dir());
    fs::create_dir(img.data_dir().join("node")).unwrap();
    fs::write(img.data_dir().join("node/key.der"), b"node key bytes").unwrap();
    assert!(mounts::is_mount_point(&img.data_dir()).unwrap());
    v.close().unwrap();
    assert!(!mounts::is_mount_point(&img.data_dir()).unwrap());
    assert!(!mounts::is_mount_point(&img.fs_dir()).unwrap());
    assert!(
        !img.data_dir().join("node").exists(),
        "data visible after close"
    );

    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert!(!v.formatted(), "our own file system was formatted again");
    assert_eq!(
        fs::read(img.data_dir().join("node/key.der")).unwrap(),
        b"node key bytes"
    );
    v.close().unwrap();
}

#[test]
fn a_wrong_key_is_refused_and_leaves_nothing_mounted() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    fs::write(img.data_dir().join("f"), b"x").unwrap();
    v.close().unwrap();
    for wrong in [key(1, 3), key(9, 2)] {
        match img.open(&owner("n1"), &wrong, FormatPolicy::IfEmpty) {
            Err(e @ Error::WrongKey { .. }) => {
                assert!(e.to_string().contains("does not unlock"), "{e}")
            }
            other => panic!("wrong key: expected WrongKey, got {other:?}"),
        }
        assert!(!mounts::is_mount_point(&img.fs_dir()).unwrap());
        assert!(!mounts::is_mount_point(&img.data_dir()).unwrap());
    }
    // The right key still opens the untouched data.
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert_eq!(fs::read(img.data_dir().join("f")).unwrap(), b"x");
    v.close().unwrap();
}

#[test]
fn the_raw_image_holds_no_plaintext_of_node_data() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    let secret = b"polis-secret-contents-7f3a9c1e2b";
    let name = "polis-secret-name-5d8e0a";
    let mut f = fs::File::create(img.data_dir().join(name)).unwrap();
    for _ in 0..64 {
        f.write_all(secret).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    // Control: the same kind of bytes outside the encrypted directory are found, so the
    // search below would see plaintext if there were any.
    let control = b"polis-control-contents-11aa22bb";
    fs::write(img.fs_dir().join("control"), control).unwrap();
    v.close().unwrap();

    let raw = img.bytes();
    assert!(
        contains(&raw, control),
        "control plaintext not found: the search is broken"
    );
    assert!(
        !contains(&raw, secret),
        "file contents found in plaintext on the image"
    );
    assert!(
        !contains(&raw, name.as_bytes()),
        "file name found in plaintext on the image"
    );
}

#[test]
fn without_the_key_the_data_cannot_be_read() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    fs::write(img.data_dir().join("plain-name"), b"contents").unwrap();
    v.close().unwrap();

    let raw = img.mount_raw();
    let names: Vec<_> = fs::read_dir(raw.join("data"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 1);
    assert_ne!(names[0], "plain-name", "file name readable without the key");
    let err = fs::read(raw.join("data").join(&names[0])).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOKEY), "{err}");
    mounts::unmount(&raw).unwrap();
}

#[test]
fn a_device_holding_something_else_is_refused_unless_told_to_format() {
    let Some(img) = Image::usable() else {
        return;
    };
    img.mkfs(&["-L", "home"]);
    let before = img.bytes();
    match img.open_own(FormatPolicy::IfEmpty) {
        Err(e @ Error::Foreign { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("labelled \"home\""), "{msg}");
            assert!(msg.contains("--data-device-format"), "{msg}");
        }
        other => panic!("expected Foreign, got {other:?}"),
    }
    assert!(img.bytes() == before, "a refused device was changed");

    let v = img.open_own(FormatPolicy::Always).unwrap();
    assert!(v.formatted());
    v.close().unwrap();
}

#[test]
fn a_device_of_another_node_is_refused_by_name() {
    let Some(img) = Image::usable() else {
        return;
    };
    img.open_own(FormatPolicy::IfEmpty)
        .unwrap()
        .close()
        .unwrap();
    let other_cluster = Owner {
        cluster: "cluster-2".into(),
        node: "n1".into(),
    };
    for (who, k) in [(owner("n2"), key(1, 2)), (other_cluster, key(1, 2))] {
        match img.open(&who, &k, FormatPolicy::IfEmpty) {
            Err(e @ Error::OtherOwner { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("node n1 of cluster cluster-1"), "{msg}");
                assert!(msg.contains(&who.to_string()), "{msg}");
            }
            other => panic!("expected OtherOwner, got {other:?}"),
        }
        assert!(!mounts::is_mount_point(&img.fs_dir()).unwrap());
    }
}

#[test]
fn mounts_left_by_a_killed_process_are_taken_over() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    fs::write(img.data_dir().join("f"), b"kept").unwrap();
    // As if the process were killed: nothing is closed.
    std::mem::forget(v);
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert_eq!(fs::read(img.data_dir().join("f")).unwrap(), b"kept");
    assert_eq!(
        loops_bound_to(&img.path()),
        1,
        "the image is bound to more than one loop device"
    );
    v.close().unwrap();
}

#[test]
fn plain_data_in_the_data_directory_is_not_hidden() {
    let Some(img) = Image::usable() else {
        return;
    };
    fs::create_dir(img.data_dir()).unwrap();
    fs::write(img.data_dir().join("old"), b"plain").unwrap();
    match img.open_own(FormatPolicy::IfEmpty) {
        Err(Error::DataDirNotEmpty { path }) => assert_eq!(path, img.data_dir()),
        other => panic!("expected DataDirNotEmpty, got {other:?}"),
    }
    assert!(!mounts::is_mount_point(&img.fs_dir()).unwrap());
}

fn loops_bound_to(image: &Path) -> usize {
    let image = image.canonicalize().unwrap();
    fs::read_dir("/sys/block")
        .unwrap()
        .filter_map(|e| fs::read_to_string(e.unwrap().path().join("loop/backing_file")).ok())
        .filter(|b| Path::new(b.trim()) == image)
        .count()
}

#[test]
fn a_block_device_is_used_as_is() {
    let Some(img) = Image::usable() else {
        return;
    };
    let dev = datafs::loopdev::attach(&img.path()).unwrap();
    let (fs_dir, data_dir, image, own) = (img.fs_dir(), img.data_dir(), img.path(), owner("n1"));
    let on_device = Spec {
        device: dev.path(),
        fs_dir: &fs_dir,
        data_dir: &data_dir,
        owner: &own,
        format: FormatPolicy::IfEmpty,
    };
    let on_image = Spec {
        device: &image,
        ..on_device
    };
    let v = datafs::open(&on_device, &key(1, 2)).unwrap();
    assert!(v.formatted());
    fs::write(img.data_dir().join("f"), b"on a block device").unwrap();
    v.close().unwrap();
    // The same file system, reached through the image file this time.
    let v = datafs::open(&on_image, &key(1, 2)).unwrap();
    assert!(!v.formatted());
    assert_eq!(
        fs::read(img.data_dir().join("f")).unwrap(),
        b"on a block device"
    );
    v.close().unwrap();
    drop(dev);
}

#[test]
fn a_missing_or_corrupted_marker_is_named() {
    let Some(img) = Image::usable() else {
        return;
    };
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    fs::write(img.data_dir().join("f"), b"x").unwrap();
    let marker = img.fs_dir().join(datafs::marker::FILE);
    fs::write(&marker, b"garbage\n").unwrap();
    v.close().unwrap();
    match img.open_own(FormatPolicy::IfEmpty) {
        Err(e @ Error::Marker { .. }) => assert!(e.to_string().contains("garbage"), "{e}"),
        other => panic!("expected Marker, got {other:?}"),
    }

    // Missing while node data exists: refused, not silently re-marked.
    let v = {
        let raw = img.mount_raw();
        fs::remove_file(raw.join(datafs::marker::FILE)).unwrap();
        mounts::unmount(&raw).unwrap();
        img.open_own(FormatPolicy::IfEmpty)
    };
    match v {
        Err(e @ Error::Marker { .. }) => assert!(e.to_string().contains("missing"), "{e}"),
        other => panic!("expected Marker, got {other:?}"),
    }
    assert!(!mounts::is_mount_point(&img.fs_dir()).unwrap());
}

#[test]
fn a_format_interrupted_before_its_marker_is_completed() {
    let Some(img) = Image::usable() else {
        return;
    };
    // What a crash right after mkfs leaves: our file system, no marker, no directory.
    img.mkfs(&["-b", "4096", "-O", "encrypt", "-L", datafs::probe::LABEL]);
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert!(!v.formatted());
    fs::write(img.data_dir().join("f"), b"x").unwrap();
    v.close().unwrap();
    let v = img.open_own(FormatPolicy::IfEmpty).unwrap();
    assert_eq!(fs::read(img.data_dir().join("f")).unwrap(), b"x");
    v.close().unwrap();
}

#[test]
fn never_formats_under_the_never_policy() {
    let Some(img) = Image::usable() else {
        return;
    };
    match img.open_own(FormatPolicy::Never) {
        Err(e @ Error::Unformatted { .. }) => assert!(e.to_string().contains("all zeros"), "{e}"),
        other => panic!("expected Unformatted, got {other:?}"),
    }
    assert!(
        img.bytes().iter().all(|&b| b == 0),
        "an empty device was written"
    );
    img.open_own(FormatPolicy::IfEmpty)
        .unwrap()
        .close()
        .unwrap();
    let v = img.open_own(FormatPolicy::Never).unwrap();
    assert!(!v.formatted());
    v.close().unwrap();
}

#[test]
fn unless_own_formats_everything_but_the_owners_file_system() {
    let Some(img) = Image::usable() else {
        return;
    };
    img.mkfs(&["-L", "home"]);
    let v = img.open_own(FormatPolicy::UnlessOwn).unwrap();
    assert!(v.formatted(), "a foreign file system was kept");
    fs::write(img.data_dir().join("f"), b"mine").unwrap();
    v.close().unwrap();
    // Its own: kept (a resumed first start).
    let v = img.open_own(FormatPolicy::UnlessOwn).unwrap();
    assert!(!v.formatted());
    assert_eq!(fs::read(img.data_dir().join("f")).unwrap(), b"mine");
    v.close().unwrap();
    // Another node's: formatted.
    let v = img
        .open(&owner("n2"), &key(3, 4), FormatPolicy::UnlessOwn)
        .unwrap();
    assert!(v.formatted());
    assert!(!img.data_dir().join("f").exists());
    v.close().unwrap();
}
