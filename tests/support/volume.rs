//! A directory laid out as the kubelet mounts a ConfigMap or Secret volume, updated as the
//! kubelet updates it.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

/// `..<generation>/` directories, a `..data` symlink to the current one, and
/// `name -> ..data/name` symlinks.
pub struct Volume {
    dir: PathBuf,
    generation: u32,
}

impl Volume {
    /// Lays out `files` (name, content) in `dir`.
    pub fn new(dir: &Path, files: &[(&str, &str)]) -> Volume {
        let volume = Volume {
            dir: dir.to_path_buf(),
            generation: 1,
        };
        volume.write_generation(files);
        symlink(volume.generation_name(), dir.join("..data")).unwrap();
        for (name, _) in files {
            symlink(format!("..data/{name}"), dir.join(name)).unwrap();
        }
        volume
    }

    /// The path of file `name` in the volume (the `name -> ..data/name` link).
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
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
