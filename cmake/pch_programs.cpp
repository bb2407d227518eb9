// The program that owns the precompiled headers shared by the single-source programs linking
// libtpucore (cmake/TpuPch.cmake); it is only compiled for its header image.
int main() { return 0; }
