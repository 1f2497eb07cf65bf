use super::*;

/// A FIFO, a device and a directory are refused without blocking; a file over the cap is
/// refused; a regular file is read.
#[test]
fn only_regular_files_within_the_cap_are_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("x.yaml");
    assert!(
        std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    let mut reader = Reader::default();
    let refused = reader.read(&fifo).unwrap_err();
    assert!(refused.contains("FIFO"), "{refused}");
    let zero = reader.read(Path::new("/dev/zero")).unwrap_err();
    assert!(zero.contains("character device"), "{zero}");
    assert!(reader.read(dir.path()).unwrap_err().contains("directory"));
    let big = dir.path().join("big.yaml");
    std::fs::write(&big, vec![b'#'; MAX_FILE_BYTES as usize + 1]).unwrap();
    assert!(reader.read(&big).unwrap_err().contains("larger than"));
    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, "domain: d\n").unwrap();
    assert_eq!(reader.read(&ok).unwrap(), "domain: d\n");
}
