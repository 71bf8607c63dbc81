double mean(const double *v, int n);
double maximum(const double *v, int n);
