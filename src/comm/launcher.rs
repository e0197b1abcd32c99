//! What an MPI launcher (`mpirun` of Open MPI or MPICH, Slurm's `srun`) tells a process
//! through its environment, read in one place: whether it was started by one, its rank and the
//! world's size (known before MPI is initialised, so commands that never initialise MPI can
//! still behave as one rank of many), and its place on its node.

/// Set by every launcher ppl supports: a process that sees one was started as an MPI rank.
const MARKERS: [&str; 4] = [
    "OMPI_COMM_WORLD_SIZE",
    "PMI_SIZE",
    "PMIX_RANK",
    "MPI_LOCALNRANKS",
];

/// Whether this process was started by an MPI launcher.
pub fn under_launcher() -> bool {
    MARKERS.iter().any(|v| std::env::var_os(v).is_some())
}

/// This process's rank in the world, if a launcher says.
pub fn world_rank() -> Option<usize> {
    first_number(&[
        "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK",
        "PMI_RANK",
        "SLURM_PROCID",
    ])
}

/// The number of ranks in the world, if a launcher says.
pub fn world_size() -> Option<usize> {
    first_number(&["OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"])
}

/// This process's index among the ranks of its node (which GPU `--device cuda` gives it).
pub fn local_rank() -> usize {
    first_number(&[
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
    ])
    .unwrap_or(0)
}

/// The ranks sharing this node (they share its cores and memory).
pub fn ranks_on_this_node() -> usize {
    first_number(&[
        "OMPI_COMM_WORLD_LOCAL_SIZE",
        "MPI_LOCALNRANKS",
        "SLURM_NTASKS_PER_NODE",
    ])
    .unwrap_or(1)
    .max(1)
}

/// The first of these variables that holds a number.
fn first_number(names: &[&str]) -> Option<usize> {
    names
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}
