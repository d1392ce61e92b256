plugins {
    id("com.android.application")
    id("org.jetbrains.kotlin.android")
}

android {
    namespace = "dev.tandem.example"
    compileSdk = 34

    defaultConfig {
        applicationId = "dev.tandem.example"
        // gomobile bind -androidapi 21: the lowest level Go's android/arm64
        // port and the NDK's arm64 toolchain support.
        minSdk = 21
        targetSdk = 34
        versionCode = 1
        versionName = "1.0"
        ndk {
            // The .aar is built for android/arm64 (gomobile bind -target=android/arm64).
            abiFilters += "arm64-v8a"
        }
    }

    buildTypes {
        release {
            isMinifyEnabled = false
        }
    }
    compileOptions {
        sourceCompatibility = JavaVersion.VERSION_17
        targetCompatibility = JavaVersion.VERSION_17
    }
    kotlinOptions {
        jvmTarget = "17"
    }
    androidResources {
        // A model in assets is copied to the app's files before it is
        // mapped; keep it uncompressed so the copy is a plain read.
        noCompress += "gguf"
    }
}

dependencies {
    // The bindings gomobile bind writes (see the root build.gradle.kts).
    implementation(files("libs/tandem.aar"))
    implementation("androidx.appcompat:appcompat:1.7.0")
    implementation("androidx.lifecycle:lifecycle-runtime-ktx:2.8.4")
    implementation("org.jetbrains.kotlinx:kotlinx-coroutines-android:1.8.1")
}
