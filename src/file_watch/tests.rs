use super::*;
use notify::event::{CreateKind, DataChange, RenameMode};

fn targets(paths: &[&str]) -> Targets {
    Targets(
        paths
            .iter()
            .map(|p| Target::new(PathBuf::from(p)))
            .collect(),
        RecursiveMode::NonRecursive,
    )
}

fn event(kind: EventKind, path: &str) -> Event {
    Event::new(kind).add_path(PathBuf::from(path))
}

fn modify(path: &str) -> Event {
    event(EventKind::Modify(ModifyKind::Data(DataChange::Any)), path)
}

/// In a watched directory every change counts, dot-entries included; siblings do not.
#[test]
fn directory_relevance() {
    let t = targets(&["/etc/limits"]);
    assert!(t.is_relevant(&modify("/etc/limits/a.yaml")));
    assert!(t.is_relevant(&event(
        EventKind::Modify(ModifyKind::Name(RenameMode::To)),
        "/etc/limits/..data"
    )));
    assert!(t.is_relevant(&event(EventKind::Create(CreateKind::Folder), "/etc/limits")));
    assert!(!t.is_relevant(&modify("/etc/limits-old/a.yaml")));
    assert!(!t.is_relevant(&modify("/etc/passwd")));
}

/// A watched file counts its own name and `..` siblings (a kubelet swap), nothing else.
#[test]
fn file_relevance() {
    let t = targets(&["/cm/limits.yaml"]);
    assert!(t.is_relevant(&modify("/cm/limits.yaml")));
    assert!(t.is_relevant(&event(
        EventKind::Modify(ModifyKind::Name(RenameMode::To)),
        "/cm/..data"
    )));
    assert!(!t.is_relevant(&modify("/cm/other.yaml")));
    assert!(!t.is_relevant(&modify("/cm/.limits.yaml.swp")));
}

/// With several files (a certificate, its key, a CA elsewhere), a change to any counts.
#[test]
fn several_files() {
    let t = targets(&["/tls/tls.crt", "/tls/tls.key", "/ca/ca.crt"]);
    assert!(t.is_relevant(&modify("/tls/tls.key")));
    assert!(t.is_relevant(&modify("/ca/ca.crt")));
    assert!(t.is_relevant(&event(
        EventKind::Modify(ModifyKind::Name(RenameMode::To)),
        "/ca/..data"
    )));
    assert!(!t.is_relevant(&modify("/tls/other.pem")));
    assert_eq!(
        t.parents().into_iter().collect::<Vec<_>>(),
        [PathBuf::from("/ca"), PathBuf::from("/tls")]
    );
}

/// Opening and reading are not changes (the reload's own reads would loop); closing after
/// a write is.
#[test]
fn reads_are_ignored() {
    let t = targets(&["/etc/limits"]);
    let open = EventKind::Access(AccessKind::Open(AccessMode::Any));
    let read = EventKind::Access(AccessKind::Close(AccessMode::Read));
    let written = EventKind::Access(AccessKind::Close(AccessMode::Write));
    assert!(!t.is_relevant(&event(open, "/etc/limits/a.yaml")));
    assert!(!t.is_relevant(&event(read, "/etc/limits")));
    assert!(t.is_relevant(&event(written, "/etc/limits/a.yaml")));
    // A rescan request carries no path: reload.
    assert!(t.is_relevant(&Event::new(EventKind::Other)));
}
