//! Limits on disk as operators change them: files replaced by rename, invalid edits, and a
//! directory laid out as the kubelet mounts a ConfigMap.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// A limits file: domain `domain`, key `k` limited to `rpu` per minute.
pub fn limits(domain: &str, rpu: u32) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    rate_limit: {{unit: minute, requests_per_unit: {rpu}}}\n"
    )
}

/// Valid YAML that fails validation (an unknown key), carrying a limit that must never show.
pub fn invalid(domain: &str) -> String {
    format!(
        "domain: {domain}\ndescriptors:\n  - key: k\n    bogus: 1\n    rate_limit: {{unit: minute, requests_per_unit: 7777}}\n"
    )
}

/// Replaces `path` atomically, as editors and `kubectl cp`-style tools do: write a temporary
/// dotfile beside it (skipped by the loader), then rename it over.
pub fn replace(path: &Path, content: &str) {
    let name = path.file_name().unwrap().to_str().unwrap();
    let temp = path.with_file_name(format!(".{name}.tmp"));
    fs::write(&temp, content).unwrap();
    fs::rename(&temp, path).unwrap();
}

/// A directory laid out as the kubelet mounts a ConfigMap: `..<generation>/` directories, a
/// `..data` symlink to the current one, and `name -> ..data/name` symlinks.
pub struct ConfigMap {
    dir: PathBuf,
    generation: u32,
}

impl ConfigMap {
    pub fn new(dir: &Path, files: &[(&str, &str)]) -> ConfigMap {
        let map = ConfigMap {
            dir: dir.to_path_buf(),
            generation: 1,
        };
        map.write_generation(files);
        symlink(map.generation_name(), dir.join("..data")).unwrap();
        for (name, _) in files {
            symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        map
    }

    fn generation_name(&self) -> String {
        format!("..2026_{:02}", self.generation)
    }

    fn write_generation(&self, files: &[(&str, &str)]) {
        let generation = self.dir.join(self.generation_name());
        fs::create_dir(&generation).unwrap();
        for (name, content) in files {
            fs::write(generation.join(name), content).unwrap();
        }
    }

    /// The kubelet's atomic update: new generation, swap `..data` by rename, delete the old.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        let old = self.dir.join(self.generation_name());
        self.generation += 1;
        self.write_generation(files);
        let temp = self.dir.join("..data_tmp");
        symlink(self.generation_name(), &temp).unwrap();
        fs::rename(&temp, self.dir.join("..data")).unwrap();
        fs::remove_dir_all(old).unwrap();
    }
}
